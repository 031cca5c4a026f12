package selection

// The others' queue from the engines' own figures (Options.EngineQueue).
//
// With several instances, an agent's turn stays at its home behind the
// requests other instances queued there, which this instance cannot see:
// its reservations are its own, and the KV events show blocks stored,
// not requests waiting (bench/EXPERIMENTS.md section 72). Where the
// engine reports its queue (engine_metrics: vllm:num_requests_waiting,
// SGLang's queue), SetExternalLoad keeps the share of it that this
// instance did not send. Each such request counts request_cost in
// load(r), as any request does; EngineQueue charges it more, about what
// it will prefill before a request sent now is admitted. A lone instance
// sends every waiting request itself (the share is zero: its decisions
// are the rule's), and a stale scrape leaves none (local reservations
// only, SetExternalLoad's zeros).

// engineQueue is the load Options.EngineQueue adds on slot s: its others'
// waiting requests at the last fresh scrape times EngineQueue. Every
// candidate pays it, not the home alone: a turn that leaves a queued home
// must not land on another queued replica (charged on the home only, the
// tool-agent trace's p99 at 8 replicas with 2 instances was 1.84x one
// instance's, against 1.31x; bench/EXPERIMENTS.md section 75).
func (rt *Router) engineQueue(s Slot) float64 {
	if rt.opt.EngineQueue <= 0 {
		return 0
	}
	q := rt.opt.EngineQueue * float64(rt.loads[s].ext.waiting.Load())
	if sat := rt.opt.EngineQueueSat; sat > 0 && q > 0 {
		q *= min(1, float64(rt.qSum.Load())/float64(max(rt.Len(), 1))/sat)
	}
	return q
}
