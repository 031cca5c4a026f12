package selection

// crowded reports whether slot s, a request's home, pays the pair term
// (Options.CrowdPair): this router's requests in flight there exceed
// CrowdPair times their mean over the usable replicas (busy in flight
// over usable replicas, at least 1). A home that a shared prefix made
// every new session's (the tool-agent trace's framework prompt held by
// one replica while others are idle) then stops taking them all.
func (rt *Router) crowded(s Slot, busy int64, usable int) bool {
	if usable <= 0 {
		return false
	}
	mean := max(1, float64(busy)/float64(usable))
	return float64(rt.loads[s].count()) > rt.opt.CrowdPair*mean
}

// DefaultOverflowLightRoom is Options.OverflowLightRoom's default.
const DefaultOverflowLightRoom = 3.0

// lightOverflow is the overflow term's weight ow on a replica of capa
// tokens of KV for a prompt of p tokens under Options.OverflowLight: the
// lighter weight where capa is below OverflowLightRoom x p.
func (rt *Router) lightOverflow(ow, capa, p float64) float64 {
	if k := rt.opt.OverflowLightAvg; k > 0 {
		if capa < k*float64(rt.promptAvg.Load())/promptAvgScale {
			return min(ow, rt.opt.OverflowLight)
		}
		return ow
	}
	room := rt.opt.OverflowLightRoom
	if room == 0 {
		room = DefaultOverflowLightRoom
	}
	if room < 0 || capa < room*p {
		return min(ow, rt.opt.OverflowLight)
	}
	return ow
}

// fleetFull reports whether every usable candidate's context in flight
// (this router's), with a prompt of prompt tokens, passes its KV capacity
// (Options.OverflowLightFull).
func (rt *Router) fleetFull(cands []Candidate, prompt int) bool {
	any := false
	var res, kv int64
	for i := range cands {
		if !cands[i].Usable {
			continue
		}
		c := &rt.loads[cands[i].Slot]
		res += c.resident.Load() + int64(prompt)
		kv += c.kv()
		if !rt.opt.OverflowLightMean && c.resident.Load()+int64(prompt) <= c.kv() {
			return false
		}
		any = true
	}
	return any && res > kv
}
