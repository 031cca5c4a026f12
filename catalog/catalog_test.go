package catalog

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

func ptrTo[T any](v T) *T { return &v }

func TestMergeModels(t *testing.T) {
	engineA := `[{"id":"llama","object":"model","created":200,"owned_by":"vllm","root":"/mnt/models/llama","parent":null,"max_model_len":8192,"permission":[{"id":"modelperm-1"}]},
	             {"id":"llama-lora","created":210,"owned_by":"vllm","root":"/mnt/adapters/sql","parent":"llama","max_model_len":8192}]`
	engineB := `[{"id":"llama","created":100,"owned_by":"vllm","root":"/mnt/other/llama","max_model_len":4096},
	             {"id":"qwen","created":300,"owned_by":"http://127.0.0.1:8007","parent":"/models/base"},
	             {"id":"","created":1}]`
	var a, b []engineModel
	for _, s := range []struct {
		src string
		dst *[]engineModel
	}{{engineA, &a}, {engineB, &b}} {
		if err := json.Unmarshal([]byte(s.src), s.dst); err != nil {
			t.Fatal(err)
		}
	}
	got := merge([][]engineModel{a, b})
	want := &List{Object: "list", Data: []Card{
		{ID: "llama", Object: "model", Created: 100, OwnedBy: "vllm", MaxModelLen: ptrTo[int64](4096)},
		{ID: "llama-lora", Object: "model", Created: 210, OwnedBy: "vllm", Parent: ptrTo("llama"), MaxModelLen: ptrTo[int64](8192)},
		{ID: "qwen", Object: "model", Created: 300, OwnedBy: "ramjet"},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("merged (-want +got):\n%s", diff)
	}
	out, _ := json.Marshal(got)
	for _, leak := range []string{"/mnt", "root", "127.0.0.1", "permission", "/models/base"} {
		if strings.Contains(string(out), leak) {
			t.Errorf("merged list leaks %q: %s", leak, out)
		}
	}
}

func TestNamesBounded(t *testing.T) {
	n := NewNames(4)
	if got := n.Label("m"); got != Other {
		t.Fatalf("unknown model label = %q, want %s", got, Other)
	}
	for i := range 10 {
		n.Add("model-" + strconv.Itoa(i))
	}
	if got := n.Label("model-0"); got != "model-0" {
		t.Errorf("added model label = %q", got)
	}
	if got := n.Label("model-7"); got != Other {
		t.Errorf("model past the bound = %q, want %s", got, Other)
	}
	if got := n.Add("model-8"); got != Other || n.Len() != 4 {
		t.Errorf("Add past the bound = %q, %d held", got, n.Len())
	}
	if got := n.Label(""); got != "" {
		t.Errorf("empty model label = %q", got)
	}
	if got := n.Intern([]byte("model-1")); got != "model-1" {
		t.Errorf("Intern held = %q", got)
	}
	if got := n.Intern([]byte("made-up")); got != "made-up" {
		t.Errorf("Intern other = %q", got)
	}
	b := []byte("model-2")
	if allocs := testing.AllocsPerRun(100, func() { _ = n.Intern(b) }); allocs != 0 {
		t.Errorf("Intern of a held name allocates %v times", allocs)
	}
}

// TestNamesOne: a set of one name (read without a map lookup) answers as
// the map does, before and after a second name joins, and Intern of its
// one name returns the held string without allocating.
func TestNamesOne(t *testing.T) {
	for _, n := range []*Names{NewNames(4, "qwen"), func() *Names { n := NewNames(4); n.Add("qwen"); return n }()} {
		if n.one.Load() == nil {
			t.Fatal("one name held: no single-name entry")
		}
		for _, s := range []string{"qwen", "qwe", "qwen3", "", Other} {
			if got, want := n.Has(s), s == "qwen"; got != want {
				t.Errorf("Has(%q) = %v, want %v", s, got, want)
			}
			if got := string(n.Intern([]byte(s))); got != s {
				t.Errorf("Intern(%q) = %q", s, got)
			}
		}
		b := []byte("qwen")
		held := n.Intern(b)
		if allocs := testing.AllocsPerRun(100, func() { held = n.Intern(b) }); allocs != 0 || unsafe.StringData(held) != unsafe.StringData(*n.one.Load()) {
			t.Errorf("Intern of the one name: %v allocations, held string %v", allocs, unsafe.StringData(held) == unsafe.StringData(*n.one.Load()))
		}
		n.Add("llama")
		if n.one.Load() != nil || !n.Has("qwen") || !n.Has("llama") || n.Has("x") || n.Len() != 2 {
			t.Errorf("two names: single entry %v, Has qwen %v llama %v x %v, %d held", n.one.Load() != nil, n.Has("qwen"), n.Has("llama"), n.Has("x"), n.Len())
		}
	}
	if NewNames(4).one.Load() != nil || NewNames(4, "a", "b").one.Load() != nil {
		t.Error("a single-name entry for an empty set or two names")
	}
}

// TestNamesFromList: NewNames with names holds what as many Adds would
// (the first max distinct non-empty ones), and concurrent readers and
// writers agree (run with -race).
func TestNamesFromList(t *testing.T) {
	list := []string{"a", "", "b", "a", "c", "d", "e"}
	bulk, one := NewNames(3, list...), NewNames(3)
	for _, s := range list {
		one.Add(s)
	}
	for _, s := range append(list, "x") {
		if bulk.Label(s) != one.Label(s) {
			t.Errorf("%q: label %q from the list, %q from Adds", s, bulk.Label(s), one.Label(s))
		}
	}
	if bulk.Len() != 3 || one.Len() != 3 {
		t.Errorf("%d and %d held, want 3", bulk.Len(), one.Len())
	}
	n := NewNames(64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				name := "m" + strconv.Itoa((g*100+i)%80)
				if n.Add(name) != Other && !n.Has(name) {
					t.Errorf("%s added but not held", name)
				}
			}
		}()
	}
	wg.Wait()
	if n.Len() != 64 {
		t.Errorf("%d held, want the bound 64", n.Len())
	}
}
