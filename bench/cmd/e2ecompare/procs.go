package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
)

// procs are ramjet instances run as separate Caddy processes (-procs):
// each its own Go runtime, its own reverse-proxy transport and its own
// ramjet state, the way several ramjet pods run behind a Service.
type procs struct {
	cmds   []*exec.Cmd
	done   []chan struct{}
	addrs  []string
	dir    string
	admin  bool     // admin endpoints on (startProcsAdmin)
	admins []string // their addresses, by instance
}

// startProcsAdmin starts one Caddy process of bin (a caddy built with the
// ramjet modules: go build -o caddy ./xcaddy) per site, each serving its
// site on a 127.0.0.1 listener this process bound (port chosen by the
// kernel) and handed over as file descriptor 3 (Caddy's "fd/3" network
// address): no port is reserved and rebound. With admin, every instance's
// admin endpoint is on a second 127.0.0.1 listener (port chosen by the
// kernel) handed over as file descriptor 4 (withAdmin), its address in
// procs.admins. It returns once every instance answers HTTP, or the first
// error; logs go to files in a temp directory whose path errors name.
func startProcsAdmin(ctx context.Context, bin string, sites []caddyrun.Site, admin bool) (*procs, error) {
	dir, err := os.MkdirTemp("", "e2ecompare-procs-")
	if err != nil {
		return nil, fmt.Errorf("procs: %w", err)
	}
	p := &procs{dir: dir, admin: admin}
	for i, s := range sites {
		if err := p.start(bin, i, s); err != nil {
			p.stop()
			return nil, err
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	hc := &http.Client{Timeout: 2 * time.Second}
	for i, a := range p.addrs {
		for {
			resp, err := hc.Get("http://" + a + "/v1/models")
			if err == nil {
				resp.Body.Close()
				break
			}
			select {
			case <-p.done[i]:
				p.stop()
				return nil, fmt.Errorf("procs: instance %d exited before serving (log %s)", i, p.log(i))
			case <-ctx.Done():
				p.stop()
				return nil, ctx.Err()
			case <-tick.C:
			}
			if time.Now().After(deadline) {
				p.stop()
				return nil, fmt.Errorf("procs: instance %d not serving after 2m: %w (log %s)", i, err, p.log(i))
			}
		}
	}
	return p, nil
}

func (p *procs) log(i int) string { return filepath.Join(p.dir, fmt.Sprintf("r%d.log", i)) }

func (p *procs) start(bin string, i int, s caddyrun.Site) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("procs: listen for instance %d: %w", i, err)
	}
	defer ln.Close() // the child holds its own copy
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return fmt.Errorf("procs: listener file for instance %d: %w", i, err)
	}
	defer f.Close()
	cfg, err := caddyrun.Config([]caddyrun.Site{s}, map[string]string{s.Name: "fd/3"})
	if err == nil && p.admin {
		cfg, err = withAdmin(cfg, "fd/4")
	}
	if err != nil {
		return err
	}
	files := []*os.File{f}
	if p.admin {
		af, addr, err := adminListener()
		if err != nil {
			return fmt.Errorf("procs: instance %d: %w", i, err)
		}
		defer af.Close()
		files = append(files, af)
		p.admins = append(p.admins, addr)
	}
	path := filepath.Join(p.dir, fmt.Sprintf("r%d.json", i))
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		return fmt.Errorf("procs: %w", err)
	}
	logf, err := os.Create(p.log(i))
	if err != nil {
		return fmt.Errorf("procs: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "run", "--config", path)
	cmd.ExtraFiles = files
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "HOME="+p.dir, "XDG_DATA_HOME="+p.dir, "XDG_CONFIG_HOME="+p.dir)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("procs: start instance %d: %w", i, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.cmds, p.done = append(p.cmds, cmd), append(p.done, done)
	p.addrs = append(p.addrs, ln.Addr().String())
	return nil
}

// stop interrupts every instance, kills those still running after 10s,
// waits for all and removes the temp directory (logs kept when an
// instance exited with an error, named in the error).
func (p *procs) stop() error {
	for _, c := range p.cmds {
		_ = c.Process.Signal(os.Interrupt)
	}
	var errs []string
	deadline := time.Now().Add(10 * time.Second)
	for i, c := range p.cmds {
		select {
		case <-p.done[i]:
		case <-time.After(time.Until(deadline)):
			_ = c.Process.Kill()
			<-p.done[i]
		}
		if st := c.ProcessState; st != nil && !st.Success() && !strings.Contains(st.String(), "interrupt") {
			errs = append(errs, fmt.Sprintf("instance %d: %s (log %s)", i, st, p.log(i)))
		}
	}
	if len(errs) > 0 {
		return errors.New("procs: " + strings.Join(errs, "; "))
	}
	return os.RemoveAll(p.dir)
}
