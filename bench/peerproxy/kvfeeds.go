package peerproxy

import (
	"context"
	"errors"
	"io"
	"log"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/kvindex"
)

// kvFeeds subscribes to the engines' KV event PUB sockets (one per
// replica) and hands every decoded event to apply. The engines are fresh
// when a run starts, so there is no replay: a feed that breaks is dialled
// again and whatever was published meanwhile is lost (counted in the
// Stats' KV events only by what arrived).
type kvFeeds struct {
	eps   []string
	apply func(rep int, ev engine.KVEvent)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newKVFeeds(eps []string, apply func(int, engine.KVEvent)) *kvFeeds {
	return &kvFeeds{eps: eps, apply: apply}
}

var discard = log.New(io.Discard, "", 0)

// start dials every feed (returning once each SUB socket is connected or
// failed) and receives on one goroutine per feed until close or ctx ends.
func (f *kvFeeds) start(ctx context.Context) {
	ctx, f.cancel = context.WithCancel(ctx)
	for i, ep := range f.eps {
		sub := f.dial(ctx, ep)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.run(ctx, i, ep, sub)
		}()
	}
}

func (f *kvFeeds) dial(ctx context.Context, ep string) zmq4.Socket {
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(2*time.Second), zmq4.WithLogger(discard))
	if err := sub.Dial(ep); err != nil {
		kvindex.CloseDrained(sub)
		return nil
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		kvindex.CloseDrained(sub)
		return nil
	}
	return sub
}

func (f *kvFeeds) run(ctx context.Context, rep int, ep string, sub zmq4.Socket) {
	dec := kvindex.NewDecoder()
	var ev engine.KVEvent
	for ctx.Err() == nil {
		if sub == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			sub = f.dial(ctx, ep)
			continue
		}
		msg, err := sub.Recv()
		if err != nil {
			kvindex.CloseDrained(sub)
			sub = nil
			continue
		}
		m, err := dec.DecodeFrames(msg.Frames)
		if err != nil {
			continue
		}
		for _, e := range m.Batch.Events {
			switch e.Kind {
			case kvindex.KindBlockStored:
				ev.Kind = engine.BlockStored
			case kvindex.KindBlockRemoved:
				ev.Kind = engine.BlockRemoved
			case kvindex.KindAllBlocksCleared:
				ev.Kind = engine.AllBlocksCleared
			default:
				continue
			}
			ev.BlockHashes = e.BlockHashes
			f.apply(rep, ev)
		}
	}
	if sub != nil {
		kvindex.CloseDrained(sub)
	}
}

// close stops every feed and waits for them.
func (f *kvFeeds) close() error {
	if f.cancel == nil {
		return errors.New("peerproxy: KV feeds never started")
	}
	f.cancel()
	f.wg.Wait()
	return nil
}
