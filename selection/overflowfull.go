package selection

// DefaultOverflowFull, DefaultOverflowFullHome and DefaultOverflowFullRoom
// are Options.OverflowFull's, OverflowFullHome's and OverflowFullRoom's
// defaults: where no usable replica has room for the prompt, the overflow
// term weighs 1 instead of 4 for a request whose warmest usable replica
// holds at least a quarter of the prompt more than its coldest, while the
// replicas' mean KV capacity is below 4 of this router's mean prompts.
// Chosen in the fleet simulation on the tool-agent traces at 8 replicas
// of 65,536 tokens (traces 1-6; held out 7-12: TTFT p50 1.06x -> 1.00x
// Dynamo's), with every guard row unchanged: without the home gate the
// light weight cost agent-fleet's p99 (its late turns are cold everywhere
// but the shared prefix), without the room gate two tool-agent traces at
// 196,608 tokens theirs (bench/EXPERIMENTS.md section 80).
const (
	DefaultOverflowFull     = 1.0
	DefaultOverflowFullHome = 0.25
	DefaultOverflowFullRoom = 4.0
)

// overflowFull is the overflow term's weight under Options.OverflowFull
// for a prompt of prompt tokens whose deepest and least usable overlaps
// are top1 and low, and whether it applies: the request has a home (top1
// leads low by OverflowFullHome of the prompt), the replicas are small
// against the mean prompt (OverflowFullRoom) and none has room (fleetFull).
// The cheap tests come first: on a fleet with room fleetFull returns at
// the first replica that has it.
func (rt *Router) overflowFull(cands []Candidate, prompt, top1, low int) (float64, bool) {
	w, home, room := rt.pk.fullW, rt.pk.fullHome, rt.pk.fullRoom
	if w <= 0 || home > 0 && (top1 <= low || float64(top1-low) < home*float64(prompt)) {
		return 0, false
	}
	avg := 0.0
	if room > 0 {
		if avg = float64(rt.promptAvg.Load()) / promptAvgScale; avg <= 0 {
			return 0, false
		}
	}
	full, kv, n := rt.fleetFull(cands, prompt)
	if !full || room > 0 && float64(kv) >= room*avg*float64(n) {
		return 0, false
	}
	return w, true
}

// fullRoomOn reports whether OverflowFull's room gate is on (it reads the
// running mean prompt, notePrompt).
func (rt *Router) fullRoomOn() bool {
	return rt.opt.OverflowFull >= 0 && rt.opt.OverflowFullRoom >= 0
}

// fleetFull reports whether no usable candidate has room for a prompt of
// prompt tokens: on every one, this router's context in flight plus the
// prompt passes the KV capacity (Options.OverflowFull); with the usable
// candidates' KV capacities summed, and their number, when it does. Then
// every replica pays the overflow term, and its weight only sets how much
// resident context outweighs overlap and pending prefill; where some
// replica has room the term keeps its weight, which moves an agent off a
// crowded home to it.
func (rt *Router) fleetFull(cands []Candidate, prompt int) (full bool, kv int64, n int) {
	for i := range cands {
		if !cands[i].Usable {
			continue
		}
		c := &rt.loads[cands[i].Slot]
		capa := c.kv()
		if c.resident.Load()+int64(prompt) <= capa {
			return false, 0, 0
		}
		kv += capa
		n++
	}
	return n > 0, kv, n
}
