package module

import (
	"errors"
	"net/http"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/observe"
	"github.com/ramjet-llm/ramjet/selection"
)

// VarRequest is the Caddy vars key (caddyhttp.GetVar) under which ramjet
// keeps its per-request state, behind a *stateRef. The body matcher, the
// lb_policy and the ramjet handler all attach to the same one; use
// requestState(r) rather than reading the var directly.
const VarRequest = "ramjet.request"

// stateRef is the vars entry: the state while its creator runs, nil once
// recycled, so that a late reader of the ended request's vars finds none,
// never another request's. Never reused; holds the body's reader, which a
// transport may read after the request ended.
type stateRef struct {
	st     atomic.Pointer[reqState]
	reader edge.Reader
}

// reqState is ramjet's state for one request, created by the ramjet module
// that sees the request first (guard, matcher, handler or policy).
//
// Concurrency: the fields without atomics are written and read only on the
// request's own goroutine (matcher, handler, Select). finish may run on
// another goroutine (the sweeper, when the request context ended), so the
// reservation is an atomic pointer and the body is reference counted.
type reqState struct {
	// body holds the request body and its parsed features; nil until read
	// (readBody, on the request goroutine). Take a reference (acquireBody)
	// to use it: the request may end (client gone) at any time, anywhere.
	body    *edge.Body
	bodyGen uint64                    // body's generation when this request got it (acquireBody)
	owner   atomic.Pointer[edge.Body] // the request's reference on body, until finish drops it
	// bodyErr is why the body could not be read (edge.ErrTooLarge, I/O).
	bodyErr error
	// ref is the vars entry; ref.reader is what readBody put back into the
	// request (hasReader): Select tells whether it is untouched.
	ref *stateRef

	// Filled by Select for the last attempt.
	fleet      *fleet
	decision   selection.Decision
	slot       selection.Slot
	observed   bool               // the ramjet handler observes the response (handler.go)
	fallback   bool               // the fallback policy chose (no usable features)
	bodyRead   bool               // ramjet tried to read the body
	pending    bool               // the outcome of the attempt to slot is not reported to the outlier detector yet (outlier.go)
	hasReader  bool               // reader is the original request's body (readBody)
	obsvInUse  bool               // a ramjet handler uses obsv (handler.go)
	guardW     bool               // obsv.w is the guard's writer (a guard in front: guard.go)
	attempts   int32              // Select calls for this request (1 + retries)
	tried1     selection.Slot     // the first attempt's slot plus one (0: none): see markTried
	poolSize   int32              // the size of the attempt's pool (outlier.go)
	routeIDHdr []string           // the chosen replica's opaque id sent in X-Ramjet-Upstream (routeID), as a shared header value; never modify
	model      string             // interned model name (the guard's model check, or Select when observed; "" when unknown)
	tried      *selection.SlotSet // every attempt's slot, allocated on a retry
	metrics    *responseObserver  // the request's response observer (metrics.go), for Select; kept idle by recycle
	baseHeader http.Header        // the request header map of the first attempt

	// route holds the preflight's token ids and the first attempt's
	// reservation (policy.go).
	route routeState

	hold selection.Hold // the current attempt's reservation
	// learned is the last ramjet decision's reservation, through which the
	// answer's cached-token count corrects the index (Router.Observe,
	// responseObserver.End); readable after its release.
	learned *selection.Reservation

	// observed holds the ramjet handler's writer and observers of this
	// request (handler.go), allocated with the state.
	obsv observedParts
	// bodyDL is the guard's deferred body deadline (guard.go).
	bodyDL edge.DeferredDeadline
}

// observedParts are what the ramjet handler wraps a response in (writer,
// observers, their list), in the state so that observing allocates nothing
// besides it. A second handler on the request (obsvInUse) allocates its
// own; a guard in front writes through w too (guardW).
type observedParts struct {
	w    observe.Writer
	list [3]observe.Observer // the responseObserver, the precise path's and a test's (more allocate)
}

// requestState returns the request's reqState, creating it (and handing
// it to the sweeper, which finishes it when the request context ends) on
// first use. w is the request's writer (nil: none), see ownedState.
func requestState(w http.ResponseWriter, r *http.Request) *reqState {
	st, created := ownedState(w, r)
	if created {
		openStates.Add(r.Context(), st)
	}
	return st
}

// ownedState returns the request's reqState and whether the caller created
// it, which the caller must then end (finish or recycle): a state without
// the sweeper's registration and timer. A guard or handler in front hands
// the state down as the owner of its writer w: then no context walk.
func ownedState(w http.ResponseWriter, r *http.Request) (st *reqState, created bool) {
	if ow, ok := w.(*observe.Writer); ok {
		if st, ok := ow.Owner().(*reqState); ok && st != nil && st.ref != nil && st.ref.st.Load() == st {
			return st, false
		}
	}
	// caddyhttp.GetVar then SetVar, with one walk up the context.
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if ref, ok := vars[VarRequest].(*stateRef); ok {
		if st := ref.st.Load(); st != nil {
			return st, false
		}
	}
	st = states.Get()
	st.slot, st.ref = -1, new(stateRef)
	st.ref.st.Store(st)
	if vars != nil {
		vars[VarRequest] = st.ref
	}
	return st, true
}

// recycle ends a state its caller created (ownedState) and pools it when
// the chain returned without an error or a panic (Caddy's error routes read
// the vars), the body was read whole, no late preflight (kvrequest.go) may
// ask it and its reservation is settled (no queued learn writes into it).
func (st *reqState) recycle(reuse bool) {
	st.finish()
	if !reuse || st.bodyRead && st.body == nil || st.route.kv != nil || !st.route.res.Settled() {
		states.Keep()
		return
	}
	st.ref.st.Store(nil)
	*st = reqState{metrics: st.metrics} // its response observer, idle (End), serves the next request
	states.Put(st)
}

// states pools request states (768 bytes each), at most 512 kept.
var states = edge.NewFreeList[reqState]("request_state", 512)

// openStates holds the request states created without the ramjet handler
// in front (a bare lb_policy ramjet, or the body matcher or guard first):
// nothing but the end of their context ends them, and the sweeper
// finishes each once it has (no context.AfterFunc: no allocation).
var openStates edge.Sweeper

// Finish ends the request (edge.Finisher, for the sweeper).
func (st *reqState) Finish() { st.finish() }

// routeID is the chosen replica's opaque id (X-Ramjet-Upstream), "" when
// none was chosen.
func (st *reqState) routeID() string {
	if len(st.routeIDHdr) == 0 {
		return ""
	}
	return st.routeIDHdr[0]
}

// markTried records that an attempt picked slot s.
func (st *reqState) markTried(s selection.Slot) {
	if st.tried != nil || st.tried1 != 0 {
		st.triedSet().Add(s)
	} else {
		st.tried1 = s + 1 // no set yet: retries are rare, and a set is 128 bytes
	}
}

// triedSet returns the set of the slots picked by earlier attempts.
func (st *reqState) triedSet() *selection.SlotSet {
	if st.tried == nil {
		st.tried = new(selection.SlotSet)
		if st.tried1 > 0 {
			st.tried.Add(st.tried1 - 1)
		}
	}
	return st.tried
}

// finish ends the request: releases its reservation and its hold on the
// body buffer. Safe to call more than once, from any goroutine.
func (st *reqState) finish() {
	if !st.hold.End() {
		return
	}
	if b := st.owner.Swap(nil); b != nil {
		b.Release()
	}
}

// acquireBody takes a reference on the request's body and returns it, or
// nil when there is none or the request already ended and the buffer went
// back to the pool. Release it with release when done.
func (st *reqState) acquireBody() *edge.Body {
	if b := st.body; b != nil && b.AcquireGen(st.bodyGen) {
		return b
	}
	return nil
}

// features returns the parsed features for extractor x, or nil when the
// body is missing, too large or malformed (parse then returns the
// *selection.RequestError).
func (st *reqState) features(x selection.Extractor, ep selection.Endpoint) *selection.Features {
	if f, err := st.parse(x, ep); err == nil {
		return f
	}
	return nil
}

// parse parses the body with selection's parser once per request
// (edge.Body.Parse keeps the result in the body buffer): the guard, the
// body matcher and the policy all call it, and only the first call
// parses. It returns errNoBody when there is no body. The caller must hold
// a reference on the body (acquireBody) while it uses the result.
func (st *reqState) parse(x selection.Extractor, ep selection.Endpoint) (*selection.Features, error) {
	if st.body == nil {
		return nil, errNoBody
	}
	f, fresh, err := st.body.Parse(x, ep)
	if fresh {
		bodyParses.Add(1)
	}
	return f, err
}

// bodyParses counts the bodies parsed by this process: the tests check
// that a request through guard, matcher and policy costs one.
var bodyParses atomic.Int64

// errNoBody: the request has no body that was read (none, too large, or
// an I/O error: see bodyErr).
var errNoBody = errors.New("no request body")

// defaultExtractor parses bodies when no ramjet policy is provisioned.
var defaultExtractor = func() selection.Extractor {
	var c selection.Config
	c.SetDefaults()
	return selection.NewExtractor(c)
}()

// sharedExtractor is the extractor the guard and the body matcher parse
// with: the one of the policy of the default state (DefaultStateKey), so
// that its Select finds the features already parsed. A policy with another
// block size or state key parses again in Select.
func sharedExtractor() selection.Extractor {
	if f := lookupFleet(""); f != nil {
		return f.Base().Extractor()
	}
	return defaultExtractor
}

// readBody reads r's body once, bounded by limit, into a pooled buffer
// kept in st (edge.ReadBody), and restores r.Body so that the next reader
// sees identical bytes. It is a no-op after the first call. On success
// st.body is set; on a body over the limit st.bodyErr is edge.ErrTooLarge
// and r.Body yields the bytes already read followed by the rest.
func (st *reqState) readBody(r *http.Request, limit int64) {
	if st.bodyRead {
		return
	}
	st.bodyRead = true
	b, rd, err := edge.ReadBody(r, limit, &st.ref.reader)
	if b == nil {
		st.bodyErr = err
		return
	}
	// The reader holds its own reference, so that the bytes outlive the
	// request's hold as long as a transport may read them.
	st.hasReader = rd == &st.ref.reader
	st.body, st.bodyGen = b, b.Gen()
	st.owner.Store(b)
	if st.hold.Ended() && st.owner.CompareAndSwap(b, nil) {
		// The request ended meanwhile and finish missed the buffer.
		b.Release()
	}
}
