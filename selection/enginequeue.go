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

// engineQueue is the load Options.EngineQueue adds on c: its others'
// waiting requests at the last fresh scrape times EngineQueue, on the
// request's home only with EngineQueueHome (pairOn false: the replica
// holding strictly the deepest overlap).
func (rt *Router) engineQueue(c *loadCell, pairOn bool) float64 {
	if rt.opt.EngineQueue <= 0 || rt.opt.EngineQueueHome && pairOn {
		return 0
	}
	return rt.opt.EngineQueue * float64(c.ext.waiting.Load())
}
