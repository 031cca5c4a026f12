package selection

// The overflow term (Options.OverflowWeight) estimates what a replica
// holds from this router's own in-flight contexts: every prompt's whole
// length, a shared prefix counted once only where one prompt extends
// another's (reserveChain). Requests of different sessions that share a
// deep prefix (a tool-agent framework's system prompt and tools) then
// read as several copies of it, and a replica where they gather as past
// its KV capacity when its engine holds them once (bench/EXPERIMENTS.md
// section 48). Where the engine reports its KV usage (engine_metrics:
// vllm:kv_cache_usage_perc, SGLang's token usage), Options.EngineOverflow
// reads that instead, plus what this router reserved since the scrape.

// SetEngineKV sets the KV tokens slot s's engine reported in use at the
// last scrape (its whole usage, every instance's requests included);
// negative: none (no fresh scrape, or no KV figure), and the overflow
// term estimates from this router's reservations. It records this
// router's resident context at the call, so that what it reserves or
// releases until the next scrape moves the figure. The engine's (real)
// tokens are stored in the index's at the applied density (RealTokens), as
// EngineKV reports them. It does not allocate
// and is safe to call concurrently with Pick; Unregister resets it.
func (rt *Router) SetEngineKV(s Slot, used int64) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	ch := &rt.chains[s]
	if used < 0 {
		ch.eng.Store(0)
		return
	}
	ch.base.Store(rt.loads[s].resident.Load())
	ch.eng.Store(min(rt.RealTokens(min(used, maxExternalKV)), maxExternalKV) + 1) // in the index's tokens
}

// EngineKV returns slot s's engine-reported KV tokens in use as last set
// by SetEngineKV; ok is false when none is set.
func (rt *Router) EngineKV(s Slot) (used int64, ok bool) {
	if s < 0 || s >= MaxReplicas {
		return 0, false
	}
	e := rt.chains[s].eng.Load()
	return e - 1, e > 0
}

// engineHeld is the context the overflow term counts on slot s under
// Options.EngineOverflow: the engine's KV tokens in use at the last
// scrape plus the change in this router's resident context since (the
// requests it sent since, less the ones it released), at least zero; ok
// is false when no scrape reported one.
func (rt *Router) engineHeld(s Slot, c *loadCell) (int64, bool) {
	ch := &rt.chains[s]
	e := ch.eng.Load()
	if e == 0 {
		return 0, false
	}
	d := c.resident.Load() - ch.base.Load()
	return max(e-1+d, 0), true
}
