package deploy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The production Caddyfile binds each listen setting's host (`bind`) and
// takes its port into the site address, so that RJ_LISTEN=127.0.0.1:8000
// listens on 127.0.0.1 only and serves any Host header. A Caddyfile cannot
// split a setting, so the port is handed to it in a derived variable
// (not a setting: ramjet sets it from the setting before adapting).
var listens = []struct{ setting, port, def string }{
	{"RJ_LISTEN", "RAMJET_LISTEN_PORT", ":8000"},
	{"RJ_METRICS_LISTEN", "RAMJET_METRICS_PORT", ":9090"},
}

// ListenPorts returns the derived port variables of the listen settings
// that lookup (os.LookupEnv) gives, their defaults where unset. A setting
// that is empty or not host:port (or :port) is an error naming it.
func ListenPorts(lookup func(string) (string, bool)) (map[string]string, error) {
	out := make(map[string]string, len(listens))
	for _, l := range listens {
		v, ok := lookup(l.setting)
		if !ok {
			v = l.def
		}
		v = strings.TrimSpace(v)
		if v == "" {
			return nil, fmt.Errorf("%s is set but empty: unset it to keep the default %s, or give host:port", l.setting, l.def)
		}
		port, err := listenPort(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", l.setting, v, err)
		}
		out[l.port] = port
	}
	return out, nil
}

func listenPort(v string) (string, error) {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return "", fmt.Errorf("want host:port or :port: %w", err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return port, nil
}

// SetListenPorts sets the derived port variables in the process
// environment from the listen settings there. ramjet's main calls it
// before Caddy adapts any Caddyfile; Adapt calls it too.
func SetListenPorts() error {
	ports, err := ListenPorts(os.LookupEnv)
	if err != nil {
		return err
	}
	for k, v := range ports {
		if err := os.Setenv(k, v); err != nil {
			return fmt.Errorf("setting %s: %w", k, err)
		}
	}
	return nil
}

// CheckListenPorts returns an error when file is deploy/Caddyfile and a
// derived port variable in the environment does not match its listen
// setting: the file is being adapted by a program that did not call
// SetListenPorts (a Caddy built with the ramjet modules but not ramjet's
// main), and would listen on another port than the setting says.
func CheckListenPorts(file string, lookup func(string) (string, bool)) error {
	if !strings.HasSuffix(filepath.ToSlash(file), "deploy/Caddyfile") {
		return nil
	}
	want, err := ListenPorts(lookup)
	if err != nil {
		return err
	}
	for _, l := range listens {
		got, ok := lookup(l.port)
		if !ok {
			got = strings.TrimPrefix(l.def, ":")
		}
		if got != want[l.port] {
			return fmt.Errorf("%s says port %s but %s is %q: adapt deploy/Caddyfile with the ramjet binary (or deploy.Adapt), which derives it", l.setting, want[l.port], l.port, got)
		}
	}
	return nil
}
