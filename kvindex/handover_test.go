package kvindex

import (
	"context"
	"testing"
	"time"
)

// TestBindHandover: the subscriber of a reloaded config starts before the
// old one stops. With the same handover key, the new one waits for the
// old one's bound address (port 0 configured: the port the system gave
// the old one), listens on it once the old one closed it, and so keeps
// the address the engines' PUB sockets redial. Without a key (or with
// another) it listens on a port of its own at once.
func TestBindHandover(t *testing.T) {
	const bind = "tcp://127.0.0.1:0"
	ep := Endpoint{Replica: "a", Events: bind, Topic: "kv@a", Bind: true}
	start := func(key string) *Subscriber {
		s, err := NewSubscriber(New(Config{BlockSize: 4}), []Endpoint{ep}, SubscriberConfig{Handover: key})
		if err != nil {
			t.Fatal(err)
		}
		s.Start(context.Background())
		t.Cleanup(func() { s.Close() })
		return s
	}
	old := start(t.Name())
	var addr string
	eventually(t, "the old subscriber listening", func() bool { addr = old.BoundAddr(bind); return addr != "" })

	other := start(t.Name() + " other") // another service: a port of its own
	eventually(t, "another service's subscriber listening", func() bool { return other.BoundAddr(bind) != "" })
	if other.BoundAddr(bind) == addr {
		t.Fatalf("another key took %s", addr)
	}

	next := start(t.Name())
	// It waits while the old one holds the address (no port of its own).
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if got := next.BoundAddr(bind); got != "" {
			t.Fatalf("the next subscriber listens on %s while the old one holds %s", got, addr)
		}
		eventuallyTick()
	}
	old.Close()
	eventually(t, "the next subscriber on the old address", func() bool { return next.BoundAddr(bind) == addr })

	// The address is handed over again, the same way.
	after := start(t.Name())
	next.Close()
	eventually(t, "handed over twice", func() bool { return after.BoundAddr(bind) == addr })

	// Without a key: a port of its own at once.
	plain := start("")
	eventually(t, "a subscriber without a key listening", func() bool { return plain.BoundAddr(bind) != "" })
	if plain.BoundAddr(bind) == addr {
		t.Fatalf("a subscriber without a key took %s", addr)
	}
}
