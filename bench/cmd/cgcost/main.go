package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cgcost:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("cgcost", flag.ContinueOnError)
	top := fs.Int("top", 20, "functions to list, by estA per request (by Ir without cache simulation)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("want two arguments, SHORT.out:COUNT LONG.out:COUNT")
	}
	a, err := loadRun(fs.Arg(0))
	if err != nil {
		return err
	}
	b, err := loadRun(fs.Arg(1))
	if err != nil {
		return err
	}
	s, err := slope(a, b)
	if err != nil {
		return err
	}
	s.write(out, *top)
	return nil
}

// profile is one callgrind run: its events and every function's self cost.
type profile struct {
	events []string
	self   map[string][]int64
	count  float64 // requests or ops
	// code is every function's Ir by 64-byte code line (addresses >> 6),
	// when the run was made with --dump-instr=yes; test are the functions
	// whose file is a _test.go (a benchmark's harness in the package
	// under test).
	code map[string]map[int64]int64
	test map[string]bool
}

// loadRun reads FILE:COUNT.
func loadRun(arg string) (*profile, error) {
	i := strings.LastIndexByte(arg, ':')
	if i < 0 {
		return nil, fmt.Errorf("%q: want FILE:COUNT", arg)
	}
	n, err := parseCount(arg[i+1:])
	if err != nil {
		return nil, err
	}
	f, err := os.Open(arg[:i])
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := parseCallgrind(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", arg[:i], err)
	}
	p.count = n
	return p, nil
}

// parseCount reads a number, or sums the requests of the overhead
// command's -json output.
func parseCount(s string) (float64, error) {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		return n, nil
	}
	raw, err := os.ReadFile(s)
	if err != nil {
		return 0, err
	}
	var rows []struct {
		Targets map[string]struct {
			Requests float64 `json:"requests"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(raw, &rows); err != nil {
		return 0, fmt.Errorf("%s: %w", s, err)
	}
	n := 0.0
	for _, r := range rows {
		for _, t := range r.Targets {
			n += t.Requests
		}
	}
	return n, nil
}

// parseCallgrind reads a callgrind out file (compressed names and
// positions or not) into self costs per function: a cost line adds to the
// current fn=, except the line after calls=, which is the call's inclusive
// cost.
func parseCallgrind(r io.Reader) (*profile, error) {
	p := &profile{self: map[string][]int64{}, code: map[string]map[int64]int64{}, test: map[string]bool{}}
	names, files := map[string]string{}, map[string]string{}
	npos, instr, fl := 1, false, ""
	var cur []int64
	var curCode map[int64]int64
	var addr int64 // the last instruction address (positions may be relative to it)
	skip := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		switch c := line[0]; {
		case c >= '0' && c <= '9' || c == '+' || c == '-' || c == '*':
			f := strings.Fields(line)
			if instr && len(f) > 0 {
				addr = position(f[0], addr)
			}
			if skip {
				skip = false
				continue
			}
			if cur == nil {
				return nil, errors.New("cost line before fn=")
			}
			if len(f) < npos {
				continue
			}
			if instr && len(f) > npos && p.events[0] == "Ir" {
				if n, err := strconv.ParseInt(f[npos], 10, 64); err == nil {
					curCode[addr>>6] += n
				}
			}
			for i, v := range f[npos:] {
				if i >= len(cur) {
					break
				}
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("cost %q: %w", v, err)
				}
				cur[i] += n
			}
		case strings.HasPrefix(line, "fn="):
			name := resolve(line[3:], names)
			if cur = p.self[name]; cur == nil {
				cur = make([]int64, len(p.events))
				p.self[name] = cur
				p.code[name] = map[int64]int64{}
			}
			curCode = p.code[name]
			if strings.HasSuffix(fl, "_test.go") {
				p.test[name] = true
			}
		case strings.HasPrefix(line, "fl="):
			fl = resolve(line[3:], files)
		case strings.HasPrefix(line, "fi="), strings.HasPrefix(line, "fe="):
			resolve(line[3:], files)
		case strings.HasPrefix(line, "cfi="), strings.HasPrefix(line, "cfl="):
			resolve(line[4:], files)
		case strings.HasPrefix(line, "cfn="):
			resolve(line[4:], names)
		case strings.HasPrefix(line, "calls="):
			skip = true
		case strings.HasPrefix(line, "positions:"):
			npos = len(strings.Fields(line)) - 1
			instr = strings.Fields(line)[1] == "instr"
		case strings.HasPrefix(line, "events:"):
			p.events = strings.Fields(line)[1:]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if p.events == nil {
		return nil, errors.New("no events: line")
	}
	return p, nil
}

// position reads an instruction address: absolute (hex or decimal), +n
// or -n relative to the last, or * for the same.
func position(s string, last int64) int64 {
	switch s[0] {
	case '*':
		return last
	case '+', '-':
		n, _ := strconv.ParseInt(s, 0, 64)
		return last + n
	}
	n, _ := strconv.ParseInt(s, 0, 64)
	return n
}

// resolve reads a function name, "(id) name" defining id, "(id)" using it.
func resolve(s string, names map[string]string) string {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "(") {
		return s
	}
	end := strings.IndexByte(s, ')')
	if end < 0 {
		return s
	}
	id, rest := s[1:end], strings.TrimSpace(s[end+1:])
	if rest != "" {
		names[id] = rest
		return rest
	}
	if n, ok := names[id]; ok {
		return n
	}
	return s
}

// costs are one function's or part's events per request.
type costs map[string]float64

// the events' names in callgrind's cache and branch simulation.
func (c costs) l1() float64 { return c["I1mr"] + c["D1mr"] + c["D1mw"] }
func (c costs) ll() float64 { return c["ILmr"] + c["DLmr"] + c["DLmw"] }
func (c costs) mp() float64 { return c["Bcm"] + c["Bim"] }

func (c costs) estA() float64 { return c["Ir"] + 10*c.l1() + 15*c.mp() }
func (c costs) estB() float64 { return c["Ir"] + 14*c.l1() + 50*c.ll() + 15*c.mp() }

func (c costs) add(d costs) {
	for k, v := range d {
		c[k] += v
	}
}

// slopes is the per-request cost of every function between two runs.
type slopes struct {
	fns       map[string]costs
	simulated bool // cache and branch events present
	// lines are the 64-byte code lines each function touches per request
	// (its Ir slope on the line at least 0.5), and partLines the distinct
	// ones of each part, "total" and "steady"; nil without
	// --dump-instr=yes.
	lines     map[string]int
	partLines map[string]int
	test      map[string]bool // functions of _test.go files: the harness
}

// part is fn's part, a function of a _test.go file being the harness.
func (s *slopes) part(fn string) string {
	if s.test[fn] {
		return "harness"
	}
	return partOf(fn)
}

func slope(a, b *profile) (*slopes, error) {
	if strings.Join(a.events, " ") != strings.Join(b.events, " ") {
		return nil, errors.New("the runs counted different events")
	}
	dn := b.count - a.count
	if dn <= 0 {
		return nil, fmt.Errorf("the second run must count more requests than the first (%g, %g)", a.count, b.count)
	}
	s := &slopes{fns: map[string]costs{}, test: map[string]bool{}}
	for fn := range union(a.self, b.self) {
		if a.test[fn] || b.test[fn] {
			s.test[fn] = true
		}
	}
	for _, e := range a.events {
		if e == "I1mr" {
			s.simulated = true
		}
	}
	zero := make([]int64, len(a.events))
	for name := range union(a.self, b.self) {
		va, vb := a.self[name], b.self[name]
		if va == nil {
			va = zero
		}
		if vb == nil {
			vb = zero
		}
		c := costs{}
		for i, e := range a.events {
			c[e] = float64(vb[i]-va[i]) / dn
		}
		s.fns[name] = c
	}
	if len(a.code)+len(b.code) > 0 {
		s.lines, s.partLines = map[string]int{}, map[string]int{}
		touched := map[string]map[int64]bool{}
		for name := range union(a.self, b.self) {
			la, lb := a.code[name], b.code[name]
			for l := range lb {
				if float64(lb[l]-la[l])/dn >= 0.5 {
					s.lines[name]++
					for _, p := range []string{s.part(name), "total", "steady"} {
						if p == "steady" && (s.part(name) == "collector" || s.part(name) == "scheduler") {
							continue
						}
						if touched[p] == nil {
							touched[p] = map[int64]bool{}
						}
						touched[p][l] = true
					}
				}
			}
		}
		for p, ls := range touched {
			s.partLines[p] = len(ls)
		}
	}
	return s, nil
}

func union(a, b map[string][]int64) map[string]bool {
	u := make(map[string]bool, len(a))
	for k := range a {
		u[k] = true
	}
	for k := range b {
		u[k] = true
	}
	return u
}

// The parts, in print order.
var parts = []string{"ramjet", "harness", "caddy", "net", "runtime", "std", "collector", "scheduler"}

// partOf names fn's part.
func partOf(fn string) string {
	switch {
	case strings.HasPrefix(fn, "github.com/ramjet-llm/ramjet/bench"):
		return "harness"
	case strings.HasPrefix(fn, "github.com/ramjet-llm/ramjet"):
		return "ramjet"
	case hasAny(fn, "github.com/caddyserver/", "go.uber.org/zap", "github.com/prometheus/"):
		return "caddy"
	case hasAny(fn, "net/", "net.", "internal/poll.", "bufio.", "syscall.", "internal/syscall/", "crypto/tls."):
		return "net"
	case hasAny(fn, collector...):
		return "collector"
	case hasAny(fn, scheduler...):
		return "scheduler"
	case hasAny(fn, "runtime.", "runtime/", "internal/runtime/", "sync.", "sync/", "gcWriteBarrier"):
		return "runtime"
	}
	return "std"
}

func hasAny(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// The runtime's collector and scheduler, by function: their counts swing
// between runs of one binary by more than a change under study.
var collector = []string{
	"runtime.gc", "runtime.mark", "runtime.scan", "runtime.sweep", "runtime.(*gcWork)", "runtime.(*mspan)",
	"runtime.(*mheap)", "runtime.(*mcentral)", "runtime.(*mcache)", "runtime.greyobject", "runtime.findObject",
	"runtime.heapBits", "runtime.bgsweep", "runtime.bgscavenge", "runtime.(*pageAlloc)",
	"runtime.(*gcControllerState)", "runtime.(*pageBits)", "runtime.(*scavenge", "runtime.typePointers",
	"runtime.(*typePointers)", "runtime.wbBuf", "runtime.(*wbBuf)", "runtime.(*sweepLocked)",
	"runtime.tryDeferToSpanScan", "runtime.(*spanSet)", "runtime.spanSetScans", "runtime.(*spanInlineMarkBits)",
	"runtime.newMarkBits", "runtime.gcDrain", "runtime.gcBgMarkWorker",
}

var scheduler = []string{
	"runtime.findRunnable", "runtime.schedule", "runtime.execute", "runtime.lock2", "runtime.unlock2",
	"runtime.casgstatus", "runtime.wakep", "runtime.stealWork", "runtime.runq", "runtime.netpoll",
	"runtime.park_m", "runtime.goready", "runtime.ready", "runtime.mcall", "runtime.gogo", "runtime.gopark",
	"runtime.futex", "runtime.notesleep", "runtime.notewakeup", "runtime.startm", "runtime.stopm",
	"runtime.mPark", "runtime.handoffp", "runtime.sysmon", "runtime.retake", "runtime.pidle",
	"runtime.checkTimers", "runtime.goschedImpl", "runtime.gosched", "runtime.resetspinning",
	"runtime.(*m).", "runtime.nanotime", "runtime.usleep", "runtime.osyield", "runtime.procyield",
	"runtime.mstart", "runtime.acquirep", "runtime.releasep", "runtime.wirep", "runtime.exitsyscall",
	"runtime.entersyscall", "runtime.reentersyscall", "runtime.(*timers)", "runtime.(*timer)",
	"runtime.selectgo", "runtime.spinning",
}

func (s *slopes) write(w io.Writer, top int) {
	by := map[string]costs{}
	total, steady := costs{}, costs{}
	for fn, c := range s.fns {
		p := s.part(fn)
		if by[p] == nil {
			by[p] = costs{}
		}
		by[p].add(c)
		total.add(c)
		if p != "collector" && p != "scheduler" {
			steady.add(c)
		}
	}
	lines := ""
	if s.lines != nil {
		lines = fmt.Sprintf(" %6s", "lines") // 64-byte code lines touched per request
	}
	if s.simulated {
		fmt.Fprintf(w, "%-10s %9s %7s %7s %7s %7s %9s %9s%s\n", "per req.", "Ir", "I1", "D1", "LL", "mispr.", "estA", "estB", lines)
	} else {
		fmt.Fprintf(w, "%-10s %9s%s\n", "per req.", "Ir", lines)
	}
	row := func(name string, c costs, n int) {
		nl := ""
		if s.lines != nil {
			nl = fmt.Sprintf(" %6d", n)
		}
		if !s.simulated {
			fmt.Fprintf(w, "%-10s %9.0f%s\n", name, c["Ir"], nl)
			return
		}
		fmt.Fprintf(w, "%-10s %9.0f %7.0f %7.0f %7.0f %7.0f %9.0f %9.0f%s\n", name, c["Ir"], c["I1mr"],
			c["D1mr"]+c["D1mw"], c.ll(), c.mp(), c.estA(), c.estB(), nl)
	}
	for _, p := range parts {
		if c := by[p]; c != nil {
			row(p, c, s.partLines[p])
		}
	}
	row("total", total, s.partLines["total"])
	row("steady", steady, s.partLines["steady"])
	if top <= 0 {
		return
	}
	names := make([]string, 0, len(s.fns))
	for fn := range s.fns {
		names = append(names, fn)
	}
	key := func(c costs) float64 {
		if s.simulated {
			return c.estA()
		}
		return c["Ir"]
	}
	sort.Slice(names, func(i, j int) bool {
		if ki, kj := key(s.fns[names[i]]), key(s.fns[names[j]]); ki != kj {
			return ki > kj
		}
		return names[i] < names[j]
	})
	fmt.Fprintln(w)
	for _, fn := range names[:min(top, len(names))] {
		row(s.part(fn), s.fns[fn], s.lines[fn])
		fmt.Fprintf(w, "           %s\n", fn)
	}
}
