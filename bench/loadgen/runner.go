package loadgen

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ramjet-llm/ramjet/bench/workload"
)

// Mode is how a replay paces its requests.
type Mode string

const (
	// ModeOpen sends every request at its trace time: a row with After < 0
	// at At, a dependent row Think after its parent completed (and not
	// before At). Concurrency only caps requests in flight; a request that
	// waits for a slot counts that wait as queue delay.
	ModeOpen Mode = "open"
	// ModeClosed runs Concurrency agents: a row is sent as soon as its
	// parent (if any) completed plus Think, and an agent is free; At is
	// ignored.
	ModeClosed Mode = "closed"
)

// ParseMode parses "open" or "closed".
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModeOpen, ModeClosed:
		return Mode(s), nil
	}
	return "", fmt.Errorf("mode %q: want open or closed", s)
}

// RunConfig describes one replay.
type RunConfig struct {
	// Label names the run in reports.
	Label string
	// Trace is the workload to replay; it must be valid.
	Trace workload.Trace
	// Synth renders the requests.
	Synth Synthesizer
	// Client sends them.
	Client *Client
	// Mode paces them; default ModeOpen.
	Mode Mode
	// Concurrency caps the requests in flight (the agents in ModeClosed);
	// default 256 in ModeOpen, 8 in ModeClosed.
	Concurrency int
	// TimeScale divides every trace time (At, Think): 10 replays a trace
	// ten times faster. Default 1.
	TimeScale float64
	// MaxDuration stops the run after this long (0: no limit); requests
	// not yet sent are counted as not sent, requests in flight are
	// canceled.
	MaxDuration time.Duration
	// Progress, when set, receives a one-line progress bar (carriage
	// return updates) every 250ms.
	Progress io.Writer
	// Overhead is the chat-template overhead the density check expects
	// (see Calibrate); zero means none.
	Overhead Overhead
	// Results, when set, receives every request's result as it completes
	// (from the run's collector goroutine; it must not block for long).
	Results func(*Result)
	// Sending, when set, is called just before each request is sent, with
	// what will be its Result.Sent (from the sending goroutine, so
	// concurrently; it must not block). With Results it tells a caller
	// which sent requests have not completed yet.
	Sending func(sent time.Duration)
}

// Run replays cfg.Trace and returns its report. It returns when every
// request completed or failed, when ctx is done, or after MaxDuration,
// and it always accounts for every request of the trace (sent, or not
// sent). The error is non-nil only for a bad configuration.
func Run(ctx context.Context, cfg RunConfig) (*Report, error) {
	if cfg.Client == nil {
		return nil, errors.New("run: no client")
	}
	if err := cfg.Trace.Validate(); err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeOpen
	}
	if cfg.TimeScale <= 0 {
		cfg.TimeScale = 1
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 256
		if cfg.Mode == ModeClosed {
			cfg.Concurrency = 8
		}
	}
	if cfg.Synth.History == "" {
		cfg.Synth.History = HistoryActual
	}
	r := newRunner(cfg)
	return r.run(ctx), nil
}

type session struct {
	replies []string
	// lost is set once a turn failed: its reply is unknown, so this and
	// later turns carry synthetic stand-ins.
	lost bool
}

type runner struct {
	cfg      RunConfig
	children [][]int // request id -> ids waiting for it
	lastTurn map[int]int
	turns    map[int][]workload.Request // session -> its rows in turn order
	sessions map[int]*session           // session -> replies so far
	agg      *aggregator
}

func newRunner(cfg RunConfig) *runner {
	t := cfg.Trace
	r := &runner{
		cfg:      cfg,
		children: make([][]int, len(t)),
		lastTurn: make(map[int]int),
		turns:    make(map[int][]workload.Request),
		sessions: make(map[int]*session),
		agg:      newAggregator(cfg.Label, t, cfg.Client.cfg.Model),
	}
	r.agg.overhead = cfg.Overhead
	for _, q := range t {
		if q.After >= 0 {
			r.children[q.After] = append(r.children[q.After], q.ID)
		}
		r.lastTurn[q.Session] = max(r.lastTurn[q.Session], q.Turn)
		r.turns[q.Session] = append(r.turns[q.Session], q) // Validate: turns in order
	}
	return r
}

func (r *runner) scale(sec float64) time.Duration {
	return time.Duration(sec / r.cfg.TimeScale * float64(time.Second))
}

// due is a request waiting for its send time.
type due struct {
	at time.Duration
	id int
}

type dueHeap []due

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].id < h[j].id
}
func (h dueHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)   { *h = append(*h, x.(due)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// job is one request handed to a sender goroutine.
type job struct {
	req       workload.Request
	scheduled time.Duration
	history   []workload.Request
	replies   []string
	keepReply bool
}

func (r *runner) run(parent context.Context) *Report {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	if r.cfg.MaxDuration > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, r.cfg.MaxDuration)
		defer stop()
	}
	t := r.cfg.Trace
	start := time.Now()
	r.agg.start = start

	var pending dueHeap
	for _, q := range t {
		if q.After < 0 {
			at := r.scale(q.At)
			if r.cfg.Mode == ModeClosed {
				at = 0
			}
			pending = append(pending, due{at, q.ID})
		}
	}
	heap.Init(&pending)

	// done never blocks a sender: at most Concurrency requests are in
	// flight and the loop below receives until none is.
	done := make(chan *Result, r.cfg.Concurrency)
	inflight := 0
	waiting := make([]job, 0) // due but no free slot, FIFO

	prog := newProgress(r.cfg.Progress, len(t), r.agg)
	defer prog.stop()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	launch := func(j job) {
		inflight++
		r.agg.sent++
		go func() {
			res := r.send(ctx, start, j)
			done <- &res
		}()
	}
	stopping := false
	ctxDone := ctx.Done()
	for {
		now := time.Since(start)
		for !stopping && pending.Len() > 0 && pending[0].at <= now {
			d := heap.Pop(&pending).(due)
			waiting = append(waiting, r.prepare(d))
		}
		for !stopping && len(waiting) > 0 && inflight < r.cfg.Concurrency {
			launch(waiting[0])
			waiting = waiting[1:]
		}
		if inflight == 0 && (stopping || (pending.Len() == 0 && len(waiting) == 0)) {
			break
		}
		var wake <-chan time.Time
		if !stopping && pending.Len() > 0 && len(waiting) == 0 {
			timer.Reset(max(0, pending[0].at-time.Since(start)))
			wake = timer.C
		}
		select {
		case res := <-done:
			inflight--
			r.complete(res, &pending, start)
		case <-wake:
		case <-ctxDone:
			stopping = true // in-flight requests see ctx and return promptly
			ctxDone = nil
		}
	}
	r.agg.notSent = len(t) - r.agg.sent
	r.agg.end = time.Now()
	if parent.Err() != nil {
		r.agg.interrupted = "canceled"
	} else if ctx.Err() != nil {
		r.agg.interrupted = "max duration reached"
	}
	prog.stop()
	return r.agg.report()
}

// prepare turns a due row into a job: its session's earlier rows from the
// trace and the replies received so far. A turn sent before an earlier
// turn completed (a trace without that dependency) carries stand-ins for
// the replies not yet known.
func (r *runner) prepare(d due) job {
	q := r.cfg.Trace[d.id]
	j := job{
		req: q, scheduled: d.at,
		history:   r.turns[q.Session][:q.Turn:q.Turn],
		keepReply: r.cfg.Synth.History == HistoryActual && q.Turn < r.lastTurn[q.Session],
	}
	if s := r.sessions[q.Session]; s != nil {
		n := min(len(s.replies), q.Turn)
		j.replies = s.replies[:n:n]
	}
	return j
}

// send renders and sends one request.
func (r *runner) send(ctx context.Context, start time.Time, j job) Result {
	q := j.req
	msgs, err := r.cfg.Synth.Messages(j.history, j.replies, q)
	var res Result
	if err != nil {
		res = Result{Err: ErrOther, ErrMsg: err.Error()}
	} else {
		sent := time.Since(start)
		if r.cfg.Sending != nil {
			r.cfg.Sending(sent)
		}
		res = r.cfg.Client.Do(ctx, msgs, q.Output, j.keepReply)
		res.Sent = sent
	}
	res.Index, res.Session, res.Turn = q.ID, q.Session, q.Turn
	res.Scheduled = j.scheduled
	res.WantPrompt, res.WantOutput = q.Input, q.Output
	res.messages = len(msgs)
	return res
}

// complete records a result and schedules the rows waiting for it. A
// failed turn still releases its session's next turn (which then carries
// the synthetic stand-in for the missing reply).
func (r *runner) complete(res *Result, pending *dueHeap, start time.Time) {
	r.agg.add(res)
	if r.cfg.Results != nil {
		r.cfg.Results(res)
	}
	q := r.cfg.Trace[res.Index]
	if q.Turn < r.lastTurn[q.Session] {
		if r.cfg.Synth.History == HistoryActual {
			s := r.sessions[q.Session]
			if s == nil {
				s = &session{}
				r.sessions[q.Session] = s
			}
			// Replies are kept in turn order: once one is missing (a
			// failed turn, or turns completing out of order), later
			// turns carry stand-ins from there on.
			if !res.OK() || len(s.replies) != q.Turn {
				s.lost = true
			}
			if !s.lost {
				s.replies = append(s.replies, res.reply)
			}
		}
	} else {
		delete(r.sessions, q.Session)
	}
	res.reply = ""
	now := time.Since(start)
	for _, c := range r.children[res.Index] {
		cq := r.cfg.Trace[c]
		at := now + r.scale(cq.Think)
		if r.cfg.Mode == ModeOpen {
			at = max(at, r.scale(cq.At))
		}
		heap.Push(pending, due{at, c})
	}
	r.children[res.Index] = nil
}
