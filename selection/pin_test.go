package selection

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// pinBodies are bodies whose fingerprints TestParsePinned pins: the agent
// bodies of the benchmark, a one-string body, bodies that take the second
// pass (tools after messages, duplicate keys), content parts (more than
// the eight partList notes, non-text parts), tool calls, escapes of every
// kind, and the completions and responses endpoints.
func pinBodies() []struct {
	name string
	ep   Endpoint
	body string
} {
	esc := `a\"b\\c\/d\be\ff\ng\rh\ti\u00e9j\u20ack\ud83d\ude00l\ud800m\udc00n` + strings.Repeat(`xyz\n`, 50)
	parts := `[{"type":"text","text":"p1 ` + esc + `"},"bare string part",{"type":"image_url","image_url":{"url":"data:x"}},{"text":null},{"text":"p5"},{"text":"p6"},{"text":"p7"},{"text":"p8"},{"text":"p9 beyond eight"}]`
	msgs := `[{"role":"system","content":"` + esc + `"},{"role":"user","name":"bob","content":` + parts + `},` +
		`{"role":"assistant","content":null,"tool_calls":[ {"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}} ]},` +
		`{"role":"tool","tool_call_id":"c1","content":"result ` + strings.Repeat("r", 300) + `"},` +
		`{"type":"function_call","call_id":"c2","name":"g","arguments":"{}"}]`
	tools := `[ {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}} ]`
	long := strings.Repeat("0123456789abcdef", 300)
	return []struct {
		name string
		ep   Endpoint
		body string
	}{
		{"agent4k", EndpointChat, chatBodyOfSize(4 << 10)},
		{"agent64k", EndpointChat, chatBodyOfSize(64 << 10)},
		{"agent256k", EndpointChat, chatBodyOfSize(256 << 10)},
		{"onestring64k", EndpointChat, oneStringBody(64 << 10)},
		{"canonical", EndpointChat, `{"model":"m","cache_salt":"s","tools":` + tools + `,"messages":` + msgs + `}`},
		{"toolsafter", EndpointChat, `{"messages":` + msgs + `,"tools":` + tools + `,"model":"m","cache_salt":"s"}`},
		{"duplicate", EndpointChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"messages":` + msgs + `}`},
		{"longstrings", EndpointChat, `{"model":"m","messages":[{"role":"user","content":"` + long + `"},{"role":"assistant","content":"` + long[:1000] + `\n` + long + `"}]}`},
		{"completions", EndpointCompletions, `{"model":"m","prompt":"` + esc + long + `"}`},
		{"completionsarr", EndpointCompletions, `{"model":"m","prompt":["` + esc + `",[1,2, 3],"` + long + `",{"a" : [ 1 ]}]}`},
		{"responses", EndpointResponses, `{"model":"m","tools":` + tools + `,"instructions":"` + esc + `","input":` + msgs + `}`},
		{"responsesstr", EndpointResponses, `{"model":"m","instructions":"be brief","input":"` + long + `"}`},
	}
}

// pinConfigs are the block geometries pinned: the defaults (256-byte
// blocks, untruncated), small blocks that truncate (16 bytes, 64 blocks),
// odd sizes, one-byte blocks and blocks larger than blocker's 512-byte
// buffer (a multiple of it and not).
var pinConfigs = []struct {
	name string
	c    Config
}{
	{"default", Config{}},
	{"b16x64", Config{BlockTokens: 4, PrefixTokens: 4 * 64, CharsPerToken: 4}},
	{"b7", Config{BlockTokens: 7, PrefixTokens: 7 * 4000, CharsPerToken: 1}},
	{"b1", Config{BlockTokens: 1, PrefixTokens: 3000, CharsPerToken: 1}},
	{"b8192", Config{BlockTokens: 2048, PrefixTokens: 2048 * 3, CharsPerToken: 4}},
	{"b600", Config{BlockTokens: 150, PrefixTokens: 150 * 40, CharsPerToken: 4}},
}

// pinSummary is one parse's fingerprint in one line: the seed, the number
// of blocks, an xxhash of all block hashes, Truncated and PromptBytes.
func pinSummary(f *Features) string {
	buf := make([]byte, 8*len(f.Blocks))
	for i, h := range f.Blocks {
		binary.LittleEndian.PutUint64(buf[8*i:], h)
	}
	return fmt.Sprintf("seed=%016x n=%d blocks=%016x trunc=%v bytes=%d", f.Seed, len(f.Blocks), xxhash.Sum64(buf), f.Truncated, f.PromptBytes)
}

// TestParsePinned holds the fingerprints (block hashes, seed, prompt
// bytes) to the values recorded from the code before the scanner and the
// block hasher were made faster (main at ce8faf2): a speed change must not
// move a single routing key. PIN_PRINT=1 prints the table.
func TestParsePinned(t *testing.T) {
	got := map[string]string{}
	for _, pc := range pinConfigs {
		c := pc.c
		c.SetDefaults()
		x := NewExtractor(c)
		for _, pb := range pinBodies() {
			f := x.NewFeatures()
			if err := x.Parse(pb.ep, []byte(pb.body), f); err != nil {
				t.Fatalf("%s/%s: %v", pc.name, pb.name, err)
			}
			got[pc.name+"/"+pb.name] = pinSummary(f)
			if os.Getenv("PIN_PRINT") != "" {
				fmt.Printf("\t%q: %q,\n", pc.name+"/"+pb.name, pinSummary(f))
			}
		}
	}
	if os.Getenv("PIN_PRINT") != "" {
		return
	}
	for k, want := range pinned {
		if got[k] != want {
			t.Errorf("%s:\n got %s\nwant %s", k, got[k], want)
		}
	}
	if len(got) != len(pinned) {
		t.Errorf("%d cases, %d pinned", len(got), len(pinned))
	}
}

// pinned was printed by PIN_PRINT=1 go test ./selection -run TestParsePinned
// on main at ce8faf2, before any change to the scanner or the hasher.
var pinned = map[string]string{
	"b600/agent4k":           "seed=d480c8225695bd8d n=5 blocks=7ef517b3f5bdb2a2 trunc=false bytes=3446",
	"b600/agent64k":          "seed=d480c8225695bd8d n=40 blocks=ea6ca256563e36a4 trunc=true bytes=55996",
	"b600/agent256k":         "seed=d480c8225695bd8d n=40 blocks=da3d4f7367033259 trunc=true bytes=224748",
	"b600/onestring64k":      "seed=d480c8225695bd8d n=40 blocks=edbda1bbf6afdb11 trunc=true bytes=65521",
	"b600/canonical":         "seed=020040f9228c19c4 n=1 blocks=9b8ade2d69450ed8 trunc=false bytes=1141",
	"b600/toolsafter":        "seed=020040f9228c19c4 n=1 blocks=9b8ade2d69450ed8 trunc=false bytes=1141",
	"b600/duplicate":         "seed=0cc09a63957fd79a n=1 blocks=fc9e228f082eef57 trunc=false bytes=1056",
	"b600/longstrings":       "seed=0cc09a63957fd79a n=17 blocks=a7b8a591e034b46b trunc=false bytes=10625",
	"b600/completions":       "seed=0cc09a63957fd79a n=8 blocks=23a0c6b69442d5eb trunc=false bytes=5037",
	"b600/completionsarr":    "seed=0cc09a63957fd79a n=8 blocks=053e305931168a18 trunc=false bytes=5057",
	"b600/responses":         "seed=0cc09a63957fd79a n=2 blocks=e3a6a55e3c7eb061 trunc=false bytes=1386",
	"b600/responsesstr":      "seed=0cc09a63957fd79a n=8 blocks=8ec47f04ed918e27 trunc=false bytes=4823",
	"default/agent4k":        "seed=d480c8225695bd8d n=13 blocks=a06d848b8cf89a42 trunc=false bytes=3446",
	"default/agent64k":       "seed=d480c8225695bd8d n=218 blocks=02778f1e81c7300f trunc=false bytes=55996",
	"default/agent256k":      "seed=d480c8225695bd8d n=877 blocks=6b30574ef838b50c trunc=false bytes=224748",
	"default/onestring64k":   "seed=d480c8225695bd8d n=255 blocks=54bef961f2c27a67 trunc=false bytes=65521",
	"default/canonical":      "seed=020040f9228c19c4 n=4 blocks=e19727696bdbf269 trunc=false bytes=1141",
	"default/toolsafter":     "seed=020040f9228c19c4 n=4 blocks=e19727696bdbf269 trunc=false bytes=1141",
	"default/duplicate":      "seed=0cc09a63957fd79a n=4 blocks=1a89f4baa8ffcc64 trunc=false bytes=1056",
	"default/longstrings":    "seed=0cc09a63957fd79a n=41 blocks=ed1271cb122fc5ba trunc=false bytes=10625",
	"default/completions":    "seed=0cc09a63957fd79a n=19 blocks=cac9cc69632cc2c4 trunc=false bytes=5037",
	"default/completionsarr": "seed=0cc09a63957fd79a n=19 blocks=a2d6de836dcdc6f9 trunc=false bytes=5057",
	"default/responses":      "seed=0cc09a63957fd79a n=5 blocks=0ed3ff9af32d18a5 trunc=false bytes=1386",
	"default/responsesstr":   "seed=0cc09a63957fd79a n=18 blocks=2a1f1650ce73e11a trunc=false bytes=4823",
	"b16x64/agent4k":         "seed=d480c8225695bd8d n=64 blocks=a5618436b6c80d06 trunc=true bytes=3446",
	"b16x64/agent64k":        "seed=d480c8225695bd8d n=64 blocks=de6352c11b385742 trunc=true bytes=55996",
	"b16x64/agent256k":       "seed=d480c8225695bd8d n=64 blocks=de6352c11b385742 trunc=true bytes=224748",
	"b16x64/onestring64k":    "seed=d480c8225695bd8d n=64 blocks=9282d1dfafe60974 trunc=true bytes=65521",
	"b16x64/canonical":       "seed=020040f9228c19c4 n=64 blocks=ad4932f06c793fed trunc=true bytes=1141",
	"b16x64/toolsafter":      "seed=020040f9228c19c4 n=64 blocks=ad4932f06c793fed trunc=true bytes=1141",
	"b16x64/duplicate":       "seed=0cc09a63957fd79a n=64 blocks=d597b8608725324c trunc=true bytes=1056",
	"b16x64/longstrings":     "seed=0cc09a63957fd79a n=64 blocks=0ec3693ce339a3d7 trunc=true bytes=10626",
	"b16x64/completions":     "seed=0cc09a63957fd79a n=64 blocks=0a0e8391c369eebe trunc=true bytes=5037",
	"b16x64/completionsarr":  "seed=0cc09a63957fd79a n=64 blocks=0c2d92cc6a1ca270 trunc=true bytes=5061",
	"b16x64/responses":       "seed=0cc09a63957fd79a n=64 blocks=c671df38716056e5 trunc=true bytes=1386",
	"b16x64/responsesstr":    "seed=0cc09a63957fd79a n=64 blocks=3218b718baeb8598 trunc=true bytes=4823",
	"b7/agent4k":             "seed=d480c8225695bd8d n=492 blocks=7ab914762f95671f trunc=false bytes=3446",
	"b7/agent64k":            "seed=d480c8225695bd8d n=4000 blocks=16ceaaf0ab7a3bf4 trunc=true bytes=55996",
	"b7/agent256k":           "seed=d480c8225695bd8d n=4000 blocks=7ea26ebd1682d6af trunc=true bytes=224748",
	"b7/onestring64k":        "seed=d480c8225695bd8d n=4000 blocks=569f480d53c05fcf trunc=true bytes=65521",
	"b7/canonical":           "seed=020040f9228c19c4 n=163 blocks=8b4d14a50ef68c45 trunc=false bytes=1141",
	"b7/toolsafter":          "seed=020040f9228c19c4 n=163 blocks=8b4d14a50ef68c45 trunc=false bytes=1141",
	"b7/duplicate":           "seed=0cc09a63957fd79a n=150 blocks=8e5b2fe6821b6708 trunc=false bytes=1056",
	"b7/longstrings":         "seed=0cc09a63957fd79a n=1517 blocks=381a519d402d9d98 trunc=false bytes=10625",
	"b7/completions":         "seed=0cc09a63957fd79a n=719 blocks=f444a82153563c01 trunc=false bytes=5037",
	"b7/completionsarr":      "seed=0cc09a63957fd79a n=722 blocks=e6a744746fe61472 trunc=false bytes=5057",
	"b7/responses":           "seed=0cc09a63957fd79a n=198 blocks=9e9681267e95ea65 trunc=false bytes=1386",
	"b7/responsesstr":        "seed=0cc09a63957fd79a n=689 blocks=bd1fa10d72b5f69d trunc=false bytes=4823",
	"b1/agent4k":             "seed=d480c8225695bd8d n=3000 blocks=d00929a0bf5352ef trunc=true bytes=3446",
	"b1/agent64k":            "seed=d480c8225695bd8d n=3000 blocks=186bae63af23b440 trunc=true bytes=55996",
	"b1/agent256k":           "seed=d480c8225695bd8d n=3000 blocks=186bae63af23b440 trunc=true bytes=224748",
	"b1/onestring64k":        "seed=d480c8225695bd8d n=3000 blocks=57f55b9e53d29f2c trunc=true bytes=65521",
	"b1/canonical":           "seed=020040f9228c19c4 n=1141 blocks=faa8d4cf1e1ddf9f trunc=false bytes=1141",
	"b1/toolsafter":          "seed=020040f9228c19c4 n=1141 blocks=faa8d4cf1e1ddf9f trunc=false bytes=1141",
	"b1/duplicate":           "seed=0cc09a63957fd79a n=1056 blocks=6a6b830da76d9513 trunc=false bytes=1056",
	"b1/longstrings":         "seed=0cc09a63957fd79a n=3000 blocks=6d69e6ad0bfbb9c9 trunc=true bytes=10626",
	"b1/completions":         "seed=0cc09a63957fd79a n=3000 blocks=dd148987623f39a0 trunc=true bytes=5037",
	"b1/completionsarr":      "seed=0cc09a63957fd79a n=3000 blocks=95cd641ad3bc4de2 trunc=true bytes=5061",
	"b1/responses":           "seed=0cc09a63957fd79a n=1386 blocks=5f7e14c524c4f233 trunc=false bytes=1386",
	"b1/responsesstr":        "seed=0cc09a63957fd79a n=3000 blocks=c5fbf1bee6a32636 trunc=true bytes=4823",
	"b8192/agent4k":          "seed=d480c8225695bd8d n=0 blocks=ef46db3751d8e999 trunc=false bytes=3446",
	"b8192/agent64k":         "seed=d480c8225695bd8d n=3 blocks=2f3164dea1bba536 trunc=true bytes=55996",
	"b8192/agent256k":        "seed=d480c8225695bd8d n=3 blocks=4643ca6996b0f56f trunc=true bytes=224748",
	"b8192/onestring64k":     "seed=d480c8225695bd8d n=3 blocks=530adc4c8065cebe trunc=true bytes=65521",
	"b8192/canonical":        "seed=020040f9228c19c4 n=0 blocks=ef46db3751d8e999 trunc=false bytes=1141",
	"b8192/toolsafter":       "seed=020040f9228c19c4 n=0 blocks=ef46db3751d8e999 trunc=false bytes=1141",
	"b8192/duplicate":        "seed=0cc09a63957fd79a n=0 blocks=ef46db3751d8e999 trunc=false bytes=1056",
	"b8192/longstrings":      "seed=0cc09a63957fd79a n=1 blocks=53b9c8f6b82d93c5 trunc=false bytes=10625",
	"b8192/completions":      "seed=0cc09a63957fd79a n=0 blocks=ef46db3751d8e999 trunc=false bytes=5037",
	"b8192/completionsarr":   "seed=0cc09a63957fd79a n=0 blocks=ef46db3751d8e999 trunc=false bytes=5057",
	"b8192/responses":        "seed=0cc09a63957fd79a n=0 blocks=ef46db3751d8e999 trunc=false bytes=1386",
	"b8192/responsesstr":     "seed=0cc09a63957fd79a n=0 blocks=ef46db3751d8e999 trunc=false bytes=4823",
}

// pinErrorBodies are malformed chat bodies whose errors (message, field,
// offset) TestParseErrorsPinned pins: the string scanner's cases in every
// order (control characters before and after escapes, with and without a
// closing quote later, bad escapes, the end of input inside a string).
var pinErrorBodies = []string{
	"{\"model\":\"a\x01b\"}",
	"{\"model\":\"a\x01b",
	"{\"model\":\"abcdefghijklmnopqrstuvwxyz\x1f\"}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"abc\\n\x01\"}]}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"abc\\n\x01",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"abc\\\"\x01 no quote after",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"abc\\q\"}]}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"abc\\u12G4\"}]}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"abc\\u12\"}]}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"abc\\",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"abcdefghijklmnopqrstuvwxyz0123456789",
	"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\x7f\ty\"}]}]}",
	"{\"messages\":[{\"role\":\"user\",\"content\":[\"x\\u00\"]}]}",
	"{\"tools\":[{\"a\":\"b\x00\"}],\"messages\":[]}",
	"{\"tools\":[{\"a\":\"b\\x\"}],\"messages\":[]}",
	"{\"ke\x02y\":1}",
	"{\"key\\",
	"{\"instructions\":\"\\ud800\\u\"}",
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" + strings.Repeat("long text ", 20) + "\\n\x0a\"}]}",
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" + strings.Repeat("long text ", 20) + "\\t\\\\\\",
}

// TestParseErrorsPinned holds the errors of pinErrorBodies to those of the
// code before the scanner was made faster (main at ce8faf2), on all three
// LLM endpoints. PIN_PRINT=1 prints the table.
func TestParseErrorsPinned(t *testing.T) {
	c := Config{}
	c.SetDefaults()
	x := NewExtractor(c)
	f := x.NewFeatures()
	n := 0
	for _, ep := range []Endpoint{EndpointChat, EndpointCompletions, EndpointResponses} {
		for i, body := range pinErrorBodies {
			got := fmt.Sprint(x.Parse(ep, []byte(body), f))
			key := fmt.Sprintf("%v/%d", ep, i)
			if os.Getenv("PIN_PRINT") != "" {
				fmt.Printf("\t%q: %q,\n", key, got)
				continue
			}
			n++
			if want, ok := pinnedErrors[key]; !ok || got != want {
				t.Errorf("%s %q:\n got %s\nwant %s", key, body, got, want)
			}
		}
	}
	if n != len(pinnedErrors) && os.Getenv("PIN_PRINT") == "" {
		t.Errorf("%d cases, %d pinned", n, len(pinnedErrors))
	}
}

// pinnedErrors was printed by PIN_PRINT=1 go test ./selection -run
// TestParseErrorsPinned on main at ce8faf2.
var pinnedErrors = map[string]string{
	"chat/0":         "invalid request body: control character 0x01 in string (field \"model\", at byte 11)",
	"chat/1":         "invalid request body: unterminated string (field \"model\", at byte 9)",
	"chat/2":         "invalid request body: control character 0x1f in string (field \"model\", at byte 36)",
	"chat/3":         "invalid request body: control character 0x01 in string (field \"messages\", at byte 44)",
	"chat/4":         "invalid request body: unterminated string (field \"messages\", at byte 38)",
	"chat/5":         "invalid request body: unterminated string (field \"messages\", at byte 38)",
	"chat/6":         "invalid request body: invalid escape 'q' in string (field \"messages\", at byte 42)",
	"chat/7":         "invalid request body: invalid \\u escape in string (field \"messages\", at byte 42)",
	"chat/8":         "invalid request body: invalid \\u escape in string (field \"messages\", at byte 42)",
	"chat/9":         "invalid request body: unterminated string (field \"messages\", at byte 38)",
	"chat/10":        "invalid request body: unterminated string (field \"messages\", at byte 38)",
	"chat/11":        "invalid request body: control character 0x09 in string (field \"messages\", at byte 64)",
	"chat/12":        "invalid request body: invalid \\u escape in string (field \"messages\", at byte 41)",
	"chat/13":        "invalid request body: control character 0x00 in string (field \"tools\", at byte 17)",
	"chat/14":        "invalid request body: invalid escape 'x' in string (field \"tools\", at byte 17)",
	"chat/15":        "invalid request body: control character 0x02 in string (at byte 4)",
	"chat/16":        "invalid request body: unterminated string (at byte 1)",
	"chat/17":        "invalid request body: invalid \\u escape in string (at byte 23)",
	"chat/18":        "invalid request body: control character 0x0a in string (field \"messages\", at byte 253)",
	"chat/19":        "invalid request body: unterminated string (field \"messages\", at byte 50)",
	"completions/0":  "invalid request body: control character 0x01 in string (field \"model\", at byte 11)",
	"completions/1":  "invalid request body: unterminated string (field \"model\", at byte 9)",
	"completions/2":  "invalid request body: control character 0x1f in string (field \"model\", at byte 36)",
	"completions/3":  "invalid request body: control character 0x01 in string (at byte 44)",
	"completions/4":  "invalid request body: unterminated string (at byte 38)",
	"completions/5":  "invalid request body: unterminated string (at byte 38)",
	"completions/6":  "invalid request body: invalid escape 'q' in string (at byte 42)",
	"completions/7":  "invalid request body: invalid \\u escape in string (at byte 42)",
	"completions/8":  "invalid request body: invalid \\u escape in string (at byte 42)",
	"completions/9":  "invalid request body: unterminated string (at byte 38)",
	"completions/10": "invalid request body: unterminated string (at byte 38)",
	"completions/11": "invalid request body: control character 0x09 in string (at byte 64)",
	"completions/12": "invalid request body: invalid \\u escape in string (at byte 41)",
	"completions/13": "invalid request body: control character 0x00 in string (at byte 17)",
	"completions/14": "invalid request body: invalid escape 'x' in string (at byte 17)",
	"completions/15": "invalid request body: control character 0x02 in string (at byte 4)",
	"completions/16": "invalid request body: unterminated string (at byte 1)",
	"completions/17": "invalid request body: invalid \\u escape in string (at byte 23)",
	"completions/18": "invalid request body: control character 0x0a in string (at byte 253)",
	"completions/19": "invalid request body: unterminated string (at byte 50)",
	"responses/0":    "invalid request body: control character 0x01 in string (field \"model\", at byte 11)",
	"responses/1":    "invalid request body: unterminated string (field \"model\", at byte 9)",
	"responses/2":    "invalid request body: control character 0x1f in string (field \"model\", at byte 36)",
	"responses/3":    "invalid request body: control character 0x01 in string (at byte 44)",
	"responses/4":    "invalid request body: unterminated string (at byte 38)",
	"responses/5":    "invalid request body: unterminated string (at byte 38)",
	"responses/6":    "invalid request body: invalid escape 'q' in string (at byte 42)",
	"responses/7":    "invalid request body: invalid \\u escape in string (at byte 42)",
	"responses/8":    "invalid request body: invalid \\u escape in string (at byte 42)",
	"responses/9":    "invalid request body: unterminated string (at byte 38)",
	"responses/10":   "invalid request body: unterminated string (at byte 38)",
	"responses/11":   "invalid request body: control character 0x09 in string (at byte 64)",
	"responses/12":   "invalid request body: invalid \\u escape in string (at byte 41)",
	"responses/13":   "invalid request body: control character 0x00 in string (field \"tools\", at byte 17)",
	"responses/14":   "invalid request body: invalid escape 'x' in string (field \"tools\", at byte 17)",
	"responses/15":   "invalid request body: control character 0x02 in string (at byte 4)",
	"responses/16":   "invalid request body: unterminated string (at byte 1)",
	"responses/17":   "invalid request body: invalid \\u escape in string (field \"instructions\", at byte 23)",
	"responses/18":   "invalid request body: control character 0x0a in string (at byte 253)",
	"responses/19":   "invalid request body: unterminated string (at byte 50)",
}
