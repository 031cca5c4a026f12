package selection

import (
	"fmt"
	"os"
)

var owStat = os.Getenv("OWSTAT") != ""

func (rt *Router) owStatDump(cands []Candidate, prompt, top1, top2 int, full bool) {
	var res, pend, kv, n int64
	u := 0
	for i := range cands {
		if !cands[i].Usable {
			continue
		}
		c := &rt.loads[cands[i].Slot]
		res += c.resident.Load()
		pend += c.pending.Load()
		kv += c.kv()
		n += c.count()
		u++
	}
	if u == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "OWS %d %t %.3f %.3f %.2f %d %d %d\n", rt.clockMS(), full, float64(res)/float64(kv), float64(pend)/float64(kv), float64(n)/float64(u), prompt, top1, top2)
}

func (rt *Router) fleetFullGate(cands []Candidate, prompt int, pm *float64) bool {
	seen := false
	var res, pend, kv int64
	for i := range cands {
		if !cands[i].Usable {
			continue
		}
		c := &rt.loads[cands[i].Slot]
		r := c.resident.Load()
		if r+int64(prompt) <= c.kv() {
			return false
		}
		seen = true
		res += r
		pend += c.pending.Load()
		kv += c.kv()
	}
	if !seen {
		return false
	}
	n := 0
	for i := range cands {
		if cands[i].Usable {
			n++
		}
	}
	*pm = float64(pend) / float64(n)
	if q := rt.opt.OFRoom; q > 0 {
		var cnt int64
		for i := range cands {
			if cands[i].Usable {
				cnt += rt.loads[cands[i].Slot].count()
			}
		}
		// mean kv < q x mean in-flight context: kv*cnt < q*res*n... per replica mean kv = kv/n; mean ctx = res/cnt
		nn := 0
		for i := range cands {
			if cands[i].Usable {
				nn++
			}
		}
		if !(cnt > 0 && float64(kv)*float64(cnt) < q*float64(res)*float64(nn)) {
			return false
		}
	}
	if q := rt.opt.OFAvg; q > 0 {
		avg := float64(rt.promptAvg.Load()) / promptAvgScale
		nn := 0
		for i := range cands {
			if cands[i].Usable {
				nn++
			}
		}
		if !(avg > 0 && float64(kv) < q*avg*float64(nn)) {
			return false
		}
	}
	if q := rt.opt.OFPRoom; q > 0 {
		nn := 0
		for i := range cands {
			if cands[i].Usable {
				nn++
			}
		}
		if !(float64(kv) < q*float64(prompt)*float64(nn)) {
			return false
		}
	}
	if q := rt.opt.OFQueue; q > 0 && float64(pend) <= q*float64(kv) {
		return false
	}
	if q := rt.opt.OFRes; q > 0 && float64(res) <= q*float64(kv) {
		return false
	}
	if q := rt.opt.OFPR; q > 0 && float64(pend) <= q*float64(res) {
		return false
	}
	return true
}
