package enginesim

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// freePorts finds a base port p with p and p+1..p+n-1 free (bounded tries).
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := true
		for i := 1; i < n; i++ {
			l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l2)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no run of free ports")
	return 0
}

// kvMsg is one received three-frame message.
type kvMsg struct {
	topic   string
	seq     uint64
	payload []byte
}

// subscribe connects a SUB socket to ep and delivers messages on a
// channel until the test ends.
func subscribe(t *testing.T, ep string) <-chan kvMsg {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	if err := sub.Dial(ep); err != nil {
		t.Fatalf("dial %s: %v", ep, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	ch := make(chan kvMsg, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
				t.Errorf("message with %d frames", len(m.Frames))
				continue
			}
			select {
			case ch <- kvMsg{string(m.Frames[0]), binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		sub.Close()
		<-done
	})
	return ch
}

// decoded is a batch decoded without knowing the encoding in advance.
type decoded struct {
	ts     float64
	rank   int64
	events []map[string]any // normalised to maps keyed by field name
}

var positional = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
	"BlockRemoved":     {"block_hashes", "medium"},
	"AllBlocksCleared": {},
}

func decodeBatch(t *testing.T, enc KVEncoding, payload []byte) decoded {
	t.Helper()
	var v any
	if err := msgpack.Unmarshal(payload, &v); err != nil {
		t.Fatalf("msgpack: %v", err)
	}
	var d decoded
	var evs []any
	switch enc {
	case KVEncodingArray:
		a, ok := v.([]any)
		if !ok || len(a) != 3 {
			t.Fatalf("array batch: %#v", v)
		}
		d.ts, evs, d.rank = a[0].(float64), a[1].([]any), toInt(a[2])
		for _, e := range evs {
			ea := e.([]any)
			tag := ea[0].(string)
			m := map[string]any{"type": tag}
			fields := positional[tag]
			if len(ea)-1 != len(fields) {
				t.Fatalf("%s has %d fields, want %d", tag, len(ea)-1, len(fields))
			}
			for i, f := range fields {
				m[f] = ea[i+1]
			}
			d.events = append(d.events, m)
		}
	case KVEncodingMap:
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("map batch: %#v", v)
		}
		d.ts, evs, d.rank = m["ts"].(float64), m["events"].([]any), toInt(m["data_parallel_rank"])
		for _, e := range evs {
			d.events = append(d.events, e.(map[string]any))
		}
	}
	return d
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int64:
		return x
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	}
	panic(fmt.Sprintf("not an integer: %#v", v))
}

// awaitMsg sends requests until a message arrives (the PUB socket drops
// messages until the subscription reached it), for up to 20 s (how many
// requests that takes depends on the machine's load).
func awaitMsg(t *testing.T, ch <-chan kvMsg, send func(i int)) kvMsg {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		send(i)
		select {
		case m := <-ch:
			return m
		case <-time.After(250 * time.Millisecond):
		}
	}
	t.Fatal("no KV event message in 20 s")
	return kvMsg{}
}

func TestKVEventsOverZMQ(t *testing.T) {
	for _, enc := range []KVEncoding{KVEncodingArray, KVEncodingMap} {
		t.Run(string(enc), func(t *testing.T) {
			// ZMQ binds the ports it is given (rank i on base+i): another
			// process may take one after freePorts, so a start failing with
			// EADDRINUSE is retried on other ports.
			var base int
			var s *Server
			for attempt := 0; s == nil; attempt++ {
				base = freePorts(t, 2)
				var err error
				s, err = Start(context.Background(), Options{Instant: true, DP: 2, KVEvents: KVEventsOptions{
					Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base), Encoding: enc, Topic: "kv"}})
				if err != nil && (attempt == 4 || !strings.Contains(err.Error(), "address already in use")) {
					t.Fatalf("Start: %v", err)
				}
			}
			t.Cleanup(func() { s.Close() })
			eps := s.KVEndpoints()
			want := []string{fmt.Sprintf("tcp://127.0.0.1:%d", base), fmt.Sprintf("tcp://127.0.0.1:%d", base+1)}
			if diff := cmp.Diff(want, eps); diff != "" {
				t.Fatalf("endpoints (-want +got):\n%s", diff)
			}
			subs := []<-chan kvMsg{subscribe(t, eps[0]), subscribe(t, eps[1])}
			for rank := 0; rank < 2; rank++ {
				var prompt string
				m := awaitMsg(t, subs[rank], func(i int) {
					// A fresh 5-block prompt each try, routed to this rank.
					prompt = engine.SyntheticText(uint64(100*rank+i), 80)
					body := fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt)
					if st, b := postJSON(t, s.URL()+"/v1/completions", body, http.Header{RankHeader: {fmt.Sprint(rank)}}); st != 200 {
						t.Fatalf("%d %s", st, b)
					}
				})
				if m.topic != "kv" {
					t.Errorf("topic %q", m.topic)
				}
				d := decodeBatch(t, enc, m.payload)
				if d.rank != int64(rank) {
					t.Errorf("batch dp rank %d, want %d", d.rank, rank)
				}
				if age := time.Since(time.Unix(0, int64(d.ts*1e9))); age < 0 || age > time.Minute {
					t.Errorf("ts %v is not now", d.ts)
				}
				if len(d.events) == 0 || d.events[0]["type"] != "BlockStored" {
					t.Fatalf("events %+v", d.events)
				}
				ev := d.events[0]
				toks := ev["token_ids"].([]any)
				hashes := ev["block_hashes"].([]any)
				if toInt(ev["block_size"]) != 16 || len(toks) != 16*len(hashes) || ev["parent_block_hash"] != nil || ev["medium"] != "GPU" {
					t.Errorf("BlockStored %+v", ev)
				}
				// The tokens are the prompt's, and the hashes chain.
				want := engine.TokenizeText(nil, prompt)
				var parent uint64
				for i, h := range hashes {
					blk := want[i*16 : (i+1)*16]
					for j := range blk {
						if uint32(toInt(toks[i*16+j])) != blk[j] {
							t.Fatalf("token %d of block %d differs", j, i)
						}
					}
					if got := uint64(toInt(h)); got != engine.HashBlock(0, parent, blk) {
						t.Fatalf("block %d hash %x", i, got)
					}
					parent = uint64(toInt(h))
				}
			}
			// Restart: the sequence starts again at 0.
			s.Restart()
			m := awaitMsg(t, subs[0], func(i int) {
				body := fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, engine.SyntheticText(uint64(1000+i), 40))
				postJSON(t, s.URL()+"/v1/completions", body, http.Header{RankHeader: {"0"}})
			})
			if m.seq != 0 {
				t.Errorf("first sequence after restart %d, want 0", m.seq)
			}
		})
	}
}

func TestKVReplayAndClear(t *testing.T) {
	s := startSim(t, Options{Instant: true, KVEvents: KVEventsOptions{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Encoding: KVEncodingMap, HashEncoding: HashBytes}})
	for i := 0; i < 3; i++ {
		body := fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, engine.SyntheticText(uint64(i), 64))
		if st, b := postJSON(t, s.URL()+"/v1/completions", body, nil); st != 200 {
			t.Fatalf("%d %s", st, b)
		}
	}
	if st, _ := postJSON(t, s.URL()+"/reset_prefix_cache", "", nil); st != 200 {
		t.Fatalf("reset_prefix_cache %d", st)
	}
	poll(20*time.Second, func() bool { return s.Stats()[0].KVBatches >= 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := zmq4.NewReq(ctx)
	defer req.Close()
	if err := req.Dial(s.KVReplayEndpoints()[0]); err != nil {
		t.Fatal(err)
	}
	start := make([]byte, 8)
	binary.BigEndian.PutUint64(start, 1)
	if err := req.Send(zmq4.NewMsg(start)); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	var kinds []string
	for i := 0; i < 20; i++ {
		m, err := req.Recv()
		if err != nil {
			t.Fatalf("replay recv: %v", err)
		}
		// REQ strips the empty delimiter: [seq, payload].
		if len(m.Frames) != 2 {
			t.Fatalf("replay frames %d", len(m.Frames))
		}
		seq := int64(binary.BigEndian.Uint64(m.Frames[0]))
		if seq == -1 {
			break
		}
		seqs = append(seqs, seq)
		d := decodeBatch(t, KVEncodingMap, m.Frames[1])
		for _, ev := range d.events {
			kinds = append(kinds, ev["type"].(string))
			if hs, ok := ev["block_hashes"].([]any); ok {
				if b, ok := hs[0].([]byte); !ok || len(b) != 8 {
					t.Errorf("hash %#v, want 8 bytes", hs[0])
				}
			}
		}
	}
	if diff := cmp.Diff([]int64{1, 2, 3}, seqs); diff != "" {
		t.Errorf("replayed sequences (-want +got):\n%s", diff)
	}
	if len(kinds) == 0 || kinds[len(kinds)-1] != "AllBlocksCleared" {
		t.Errorf("replayed kinds %v, want AllBlocksCleared last", kinds)
	}
}

func TestOffsetEndpointPort(t *testing.T) {
	tests := []struct {
		give    string
		rank    int
		want    string
		wantErr bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", false},
		{"tcp://*:5557", 3, "tcp://*:5560", false},
		{"tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0", false},
		{"ipc:///tmp/x", 1, "", true},
	}
	for _, tt := range tests {
		got, err := OffsetEndpointPort(tt.give, tt.rank)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("OffsetEndpointPort(%q, %d) = %q, %v", tt.give, tt.rank, got, err)
		}
	}
}
