package module

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestE2EAgreementFromAnswers: several ramjet instances on the default
// path (no KV events), each its own state (index, reservations) in one
// real Caddy, header-routed, in front of the same 8 engine simulators.
// Instance b learns from an engine's answer (cached_tokens) that another
// instance placed a conversation (its second turn, sent where rendezvous
// puts it on an idle fleet, finds the first turn cached), which turns its
// agreement band on; then, with its own requests in flight on the replica
// a fresh instance (p<i>) places a new group's prompt on, b still sends
// the group's next user there and the engine serves the group's prefix
// from its cache, while b's view has idler replicas (its requests there
// past their first token: a replica still prefilling b's own requests is
// not a band target). The same for an agent's context past AgreeMax
// (20,000 tokens): b sends the agent's next turn where a fresh instance
// placed its first (the home band).
func TestE2EAgreementFromAnswers(t *testing.T) {
	ss := startSims(t, 8, enginesim.Options{TimeScale: 1})
	const placers = 32
	insts := []string{"b"}
	for i := range placers {
		insts = append(insts, fmt.Sprintf("p%d", i))
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "{\n\tadmin {ADMIN}\n\tauto_https off\n}\n\nhttp://{ADDR} {\n")
	for _, in := range insts {
		fmt.Fprintf(&sb, "\t@%s header X-Inst %s\n\thandle @%s {\n\t\tramjet_observe\n\t\treverse_proxy %s {\n\t\t\tlb_policy ramjet {\n\t\t\t\tstate_key agree_%s\n\t\t\t}\n\t\t}\n\t}\n",
			in, in, in, strings.Join(ss.dials(), " "), in)
	}
	sb.WriteString("}\n")
	c := startCaddyfile(t, sb.String())
	client := func(in string, timeout time.Duration) openai.Client {
		return openai.NewClient(option.WithBaseURL(c.url("/v1/")), option.WithAPIKey("test"), option.WithMaxRetries(0),
			option.WithRequestTimeout(timeout), option.WithHeader("X-Inst", in))
	}
	// send returns the engine that served msgs through instance in, and
	// its cached tokens.
	send := func(in string, msgs ...openai.ChatCompletionMessageParamUnion) (int, int64) {
		t.Helper()
		var resp *http.Response
		cl := client(in, 30*time.Second)
		out, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: "qwen3-8b", Messages: msgs, MaxTokens: openai.Int(4),
		}, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatalf("%s: chat: %v", in, err)
		}
		id, f := resp.Header.Get(HeaderUpstream), lookupFleet("agree_"+in)
		for i, s := range ss {
			if f.RouteID(s.Addr()) == id {
				return i, out.Usage.PromptTokensDetails.CachedTokens
			}
		}
		t.Fatalf("%s: route id %q names no engine", in, id)
		return -1, 0
	}
	router := func(in string) *selection.Router { return lookupFleet("agree_" + in).Router() }

	// A conversation's first turn through p0, its second through b.
	sys, q1 := systemMsg(longText("agent conversation", 6000)), userMsg(longText("first question", 1500))
	x, _ := send("p0", sys, q1)
	if router("b").Several() {
		t.Fatal("b's agreement on before any answer")
	}
	y, cached := send("b", sys, q1, openai.AssistantMessage("ok"), userMsg(longText("second question", 1500)))
	if y != x || cached < 1000 {
		t.Fatalf("b sent the second turn to engine %d (%d cached tokens), p0 the first to %d", y, cached, x)
	}
	if !router("b").Several() {
		t.Fatalf("b's agreement off after an answer with %d cached tokens it never sent", cached)
	}
	if router("p0").Several() {
		t.Fatal("p0's agreement on: its answers held only what it sent")
	}
	// The same through Caddy's metrics: the gauge of other instances seen.
	m := c.adminMetrics()
	for in, want := range map[string]string{"b": "1", "p0": "0"} {
		if line := `ramjet_other_instances_seen{fleet="agree_` + in + `"} ` + want; !strings.Contains(m, line) {
			t.Errorf("metrics lack %q", line)
		}
	}

	// b's own slow requests in flight (distinct prompts, long outputs).
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	const slow = 5
	for i := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := client("b", 5*time.Minute)
			st := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model: "qwen3-8b", Messages: []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("slow %d", i), 800))},
				MaxTokens: openai.Int(4000),
			})
			for st.Next() {
			}
			_ = st.Close()
		}()
	}
	inflight := func(s selection.Slot) int64 { n, _ := router("b").Load(s); return n }
	pending := func(s selection.Slot) int64 { _, p := router("b").Load(s); return p }
	slot := func(i int) selection.Slot {
		s, ok := router("b").Lookup(ss[i].Addr())
		if !ok {
			t.Fatalf("engine %d not registered in b", i)
		}
		return s
	}
	eventually(t, "b's slow requests in flight, past their first token", func() bool {
		var n, p int64
		for i := range ss {
			n, p = n+inflight(slot(i)), p+pending(slot(i))
		}
		return n == slow && p == 0
	})

	// Fresh instances place new prompts (first(i)) where rendezvous puts
	// them on their idle views; where b has requests in flight there (and
	// an idler replica elsewhere), b sends the prompts' successors
	// (next(i)) there too and the engine serves what the placer sent from
	// its cache. follow checks two of them and returns the next placer.
	type msgs = []openai.ChatCompletionMessageParamUnion
	follow := func(what string, i int, first, next func(i int) msgs, minCached int64) int {
		t.Helper()
		checked := 0
		for ; i < placers && checked < 2; i++ {
			in := fmt.Sprintf("p%d", i)
			x, _ := send(in, first(i)...)
			idler := false
			for j := range ss {
				idler = idler || inflight(slot(j)) < inflight(slot(x))
			}
			if inflight(slot(x)) == 0 || !idler {
				continue
			}
			checked++
			y, cached := send("b", next(i)...)
			if y != x || cached < minCached {
				t.Fatalf("%s %d: b sent the successor to engine %d (%d cached tokens; b's own requests there %d), %s the first to %d",
					what, i, y, cached, inflight(slot(y)), in, x)
			}
			t.Logf("%s %d: b followed %s to engine %d past its own %d requests there, %d cached tokens", what, i, in, x, inflight(slot(x)), cached)
		}
		if checked == 0 {
			t.Fatalf("no %s landed on a replica where b had requests in flight", what)
		}
		return i
	}
	// A group's first and second users (the agreement band).
	group := func(i int) openai.ChatCompletionMessageParamUnion {
		return systemMsg(longText(fmt.Sprintf("group %d document", i), 6000))
	}
	i := follow("group", 1,
		func(i int) msgs { return msgs{group(i), userMsg(longText("user one asks", 1200))} },
		func(i int) msgs { return msgs{group(i), userMsg(longText("user two asks", 1200))} }, 1000)
	// An agent's context, longer than AgreeMax (20,000 tokens), and its
	// next turn, which b never saw (the home band: the rendezvous replica
	// of the agent's own first block).
	agent := func(i int) msgs {
		return msgs{systemMsg(longText(fmt.Sprintf("agent %d tools and repository", i), 80000)), userMsg(longText("the task", 2000))}
	}
	follow("agent", i, agent, func(i int) msgs {
		return append(agent(i), openai.AssistantMessage("a tool call"), userMsg(longText("the tool's result", 4000)))
	}, 16000)
}
