package kvindex

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
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

// dnsResolver is a resolver asking the DNS servers servers, one in turn
// per query, as Caddy's transport resolvers option does; nil (the
// system's) without servers. The servers were validated (ValidateFeeds).
func dnsResolver(servers []string) *net.Resolver {
	if len(servers) == 0 {
		return nil
	}
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i], _ = resolverAddr(s)
	}
	var next atomic.Uint32
	var d net.Dialer
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addrs[int(next.Add(1)-1)%len(addrs)])
	}}
}

// resolveEndpoint returns ep ("tcp://host:port") with its host name
// resolved through the DNS servers resolvers; ep unchanged without
// resolvers or when its host is an IP address. (zmq4 dials with the
// system's resolver.)
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
	ips, err := dnsResolver(resolvers).LookupIP(ctx, "ip", host)
	if err != nil {
		return "", fmt.Errorf("kvindex: resolving %s: %w", host, err)
	}
	return "tcp://" + net.JoinHostPort(ips[0].String(), port), nil
}
