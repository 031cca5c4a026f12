package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// addressFamilies is the prefix of the metric families that label series
// with engine addresses: Caddy's reverse-proxy families (today
// caddy_reverse_proxy_upstreams_healthy{upstream="<dial address>"}).
const addressFamilies = "caddy_reverse_proxy_"

// WithoutAddresses gathers g without the families that name engine
// addresses (Caddy's caddy_reverse_proxy_* families). The same health
// state is in ramjet_upstream_healthy, labelled with route ids; every
// other family is gathered unchanged. The ramjet_metrics handler of the
// ops port serves it.
func WithoutAddresses(g prometheus.Gatherer) prometheus.Gatherer { return withoutAddresses{g} }

// withoutAddresses is WithoutAddresses' gatherer.
type withoutAddresses struct{ g prometheus.Gatherer }

func (w withoutAddresses) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := w.g.Gather()
	out := mfs[:0]
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), addressFamilies) {
			out = append(out, mf)
		}
	}
	return out, err
}
