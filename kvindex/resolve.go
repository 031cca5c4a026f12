package kvindex

import (
	"context"
	"fmt"
	"net"
	"strings"
)

// resolverAddr is a DNS server's address as Endpoint.Resolvers gives it
// ("host" or "host:port"), with port 53 by default.
func resolverAddr(s string) (string, error) {
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s, nil
	}
	if s == "" || strings.ContainsAny(s, "/ ") {
		return "", fmt.Errorf("bad DNS server %q", s)
	}
	return net.JoinHostPort(strings.Trim(s, "[]"), "53"), nil
}

// resolveEndpoint returns ep ("tcp://host:port") with its host name
// resolved through the DNS servers resolvers, tried in turn, as Caddy's
// transport resolvers option does for the engines' HTTP; ep unchanged
// without resolvers or when its host is an IP address.
func resolveEndpoint(ctx context.Context, ep string, resolvers []string) (string, error) {
	if len(resolvers) == 0 {
		return ep, nil
	}
	host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return "", fmt.Errorf("kvindex: endpoint %q: %w", ep, err)
	}
	if net.ParseIP(host) != nil {
		return ep, nil
	}
	var lastErr error
	for _, s := range resolvers {
		server, err := resolverAddr(s)
		if err != nil {
			return "", err
		}
		var d net.Dialer
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, server)
		}}
		ips, err := r.LookupIP(ctx, "ip", host)
		if err == nil && len(ips) > 0 {
			return "tcp://" + net.JoinHostPort(ips[0].String(), port), nil
		}
		lastErr = err
	}
	return "", fmt.Errorf("kvindex: resolving %s: %w", host, lastErr)
}
