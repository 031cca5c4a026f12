package module

import "github.com/ramjet-llm/ramjet/kvindex"

// KVPreflightReport is what the precise path of one state key recorded of
// its tokenize preflights and predictions (kvindex.PreflightReport).
type KVPreflightReport = kvindex.PreflightReport

// KVPreflight returns the report of the precise path provisioned last for
// stateKey, and false when it has none.
func KVPreflight(stateKey string) (KVPreflightReport, bool) {
	k, _ := kvLive.Get(stateKey)
	if k == nil {
		return KVPreflightReport{}, false
	}
	return kvindex.NewPreflightReport(k.p, k.tokLatency), true
}
