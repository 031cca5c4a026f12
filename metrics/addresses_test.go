package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWithoutAddresses: the gatherer drops exactly the caddy_reverse_proxy_
// families.
func TestWithoutAddresses(t *testing.T) {
	reg := prometheus.NewRegistry()
	healthy := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "caddy_reverse_proxy_upstreams_healthy", Help: "h"}, []string{"upstream"})
	healthy.WithLabelValues("127.0.0.1:8100").Set(1)
	own := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ramjet_upstream_healthy", Help: "h"}, []string{"upstream"})
	own.WithLabelValues("r-1a2b").Set(1)
	reg.MustRegister(healthy, own)
	n, err := testutil.GatherAndCount(WithoutAddresses(reg))
	if err != nil || n != 1 {
		t.Fatalf("series gathered = %d, %v; want 1", n, err)
	}
	if n, _ := testutil.GatherAndCount(WithoutAddresses(reg), "caddy_reverse_proxy_upstreams_healthy"); n != 0 {
		t.Errorf("caddy_reverse_proxy_upstreams_healthy series = %d, want 0", n)
	}
}
