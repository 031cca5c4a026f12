package caddyblock

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/google/go-cmp/cmp"
)

type inner struct {
	Mode   string         `json:"mode,omitempty" caddyfile:"arg"`
	Window caddy.Duration `json:"window,omitempty"`
	Pos    *int           `json:"position,omitempty"`
}

type embedded struct {
	Scheme string `json:"scheme,omitempty"`
}

type config struct {
	embedded
	Name   string         `json:"name,omitempty"`
	N      int            `json:"n,omitempty"`
	Size   int64          `json:"size,omitempty"`
	X      float64        `json:"x,omitempty"`
	On     bool           `json:"on,omitempty"`
	List   []string       `json:"list,omitempty"`
	Wait   caddy.Duration `json:"wait,omitempty"`
	Inner  *inner         `json:"inner,omitempty"`
	Hidden string         `json:"-"`
}

func block(set *[]string) *Block {
	return &Block{
		Name: "test",
		Zero: func(p string) bool { return p == "x" || p == "inner position" || p == "inner window" },
		Set:  func(p string) { *set = append(*set, p) },
		Check: map[string]func(string) (string, error){"scheme": func(v string) (string, error) {
			if v != "http" && v != "https" {
				return "", errBadScheme
			}
			return v, nil
		}},
		Words: map[string]map[string]any{"n": {"off": -1}, "inner position": {"overall": nil}},
	}
}

type schemeError struct{}

func (schemeError) Error() string { return "must be http or https" }

var errBadScheme = schemeError{}

func TestParse(t *testing.T) {
	zero := 0
	tests := []struct {
		name    string
		give    string
		want    config
		wantSet []string
		wantErr string
	}{
		{name: "types", give: "name a\nn 3\nsize 64KiB\nx 0\non\nlist a,b c\nwait 1d\nscheme https",
			want: config{embedded: embedded{Scheme: "https"}, Name: "a", N: 3, Size: 64 << 10, X: 0, On: true,
				List: []string{"a", "b", "c"}, Wait: caddy.Duration(24 * time.Hour)},
			wantSet: []string{"name", "n", "size", "x", "on", "list", "wait", "scheme"}},
		{name: "word", give: "n off", want: config{N: -1}, wantSet: []string{"n"}},
		{name: "nested", give: "inner observe {\nwindow 2s\nposition 0\n}",
			want:    config{Inner: &inner{Mode: "observe", Window: caddy.Duration(2 * time.Second), Pos: &zero}},
			wantSet: []string{"inner window", "inner position", "inner"}},
		{name: "zero duration allowed", give: "inner {\nwindow 0s\n}", want: config{Inner: &inner{}},
			wantSet: []string{"inner window", "inner"}},
		{name: "nested word", give: "inner {\nposition overall\n}", want: config{Inner: &inner{}},
			wantSet: []string{"inner position", "inner"}},
		{name: "unknown", give: "bogus 1", wantErr: "test: unrecognized option 'bogus'"},
		{name: "no json name", give: "hidden 1", wantErr: "test: unrecognized option 'hidden'"},
		{name: "nested unknown", give: "inner {\nbogus 1\n}", wantErr: "inner: unrecognized option 'bogus'"},
		{name: "twice", give: "name a\nname b", wantErr: "test: name specified more than once"},
		{name: "nested twice", give: "inner {\nwindow 1s\nwindow 2s\n}", wantErr: "inner: window specified more than once"},
		{name: "missing", give: "name", wantErr: "name: missing value"},
		{name: "too many", give: "name a b", wantErr: "name: too many values"},
		{name: "too many args", give: "inner a b", wantErr: "inner: too many values"},
		{name: "block on value", give: "name a {\nb\n}", wantErr: "name: takes no block"},
		{name: "not int", give: "n 1.5", wantErr: `n: "1.5" is not an integer`},
		{name: "zero int", give: "n 0", wantErr: `n: "0" is not a positive integer`},
		{name: "negative int", give: "n -2", wantErr: `n: "-2" is not a positive integer`},
		{name: "not size", give: "size big", wantErr: `size: "big" is not a size`},
		{name: "NaN", give: "x NaN", wantErr: `x: "NaN" is not a number`},
		{name: "duration", give: "wait soon", wantErr: `wait: "soon" is not a positive duration`},
		{name: "zero duration", give: "wait 0s", wantErr: `wait: "0s" is not a positive duration`},
		{name: "negative duration allowed zero", give: "inner {\nwindow -1s\n}", wantErr: `inner window: "-1s" is not a positive duration`},
		{name: "check", give: "scheme ftp", wantErr: "scheme: must be http or https"},
		{name: "bool", give: "on maybe", wantErr: `on: "maybe" is not a boolean`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got config
			var set []string
			err := block(&set).Parse(caddyfile.NewTestDispenser("{\n"+tt.give+"\n}"), &got)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(config{})); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantSet, set); diff != "" {
				t.Errorf("set (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLine checks the line form: an option without a value keeps its
// default and is not reported as set.
func TestLine(t *testing.T) {
	var set []string
	b := block(&set)
	b.Line = true
	got := config{Name: "default", N: 7}
	if err := b.Parse(caddyfile.NewTestDispenser("{\nname\nn\nlist\nsize 1KB\n}"), &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != "default" || got.N != 7 || got.List != nil || got.Size != 1000 {
		t.Errorf("got %+v, want the defaults kept and size 1000", got)
	}
	if diff := cmp.Diff([]string{"size"}, set); diff != "" {
		t.Errorf("set (-want +got):\n%s", diff)
	}
}

// TestCustomRepeatSub checks custom options, repeats, Sub's renamed
// options, Known and Read.
func TestCustomRepeatSub(t *testing.T) {
	var got config
	var set []string
	b := block(&set)
	var tags []string
	b.Custom = map[string]func(*caddyfile.Dispenser) error{
		"tag": func(d *caddyfile.Dispenser) error { tags = append(tags, d.RemainingArgs()...); return nil },
		"sub": func(d *caddyfile.Dispenser) error {
			return b.Sub(d, "sub", &got, map[string]string{"label": "name"})
		},
	}
	b.Repeat = map[string]bool{"tag": true}
	src := "{\ntag a\ntag b\nsub {\nlabel l\n}\n}"
	if err := b.Parse(caddyfile.NewTestDispenser(src), &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != "l" || !cmp.Equal(tags, []string{"a", "b"}) {
		t.Errorf("name %q tags %v, want l [a b]", got.Name, tags)
	}
	err := b.Parse(caddyfile.NewTestDispenser("{\nsub {\nname x\n}\n}"), &got)
	if err == nil || !strings.Contains(err.Error(), "sub: unrecognized option 'name'") {
		t.Errorf("Sub with a JSON name: err = %v", err)
	}
	if !b.Known(&got, "tag") || !b.Known(&got, "scheme") || b.Known(&got, "bogus") {
		t.Error("Known: want tag and scheme, not bogus")
	}
	d := caddyfile.NewTestDispenser("n 4")
	d.Next()
	if err := b.Read(d, &got); err != nil || got.N != 4 {
		t.Errorf("Read: n = %d, err %v", got.N, err)
	}
	d = caddyfile.NewTestDispenser("wait 1s")
	d.Next()
	if err := b.Option(d, "my_wait", &got, "wait"); err != nil || got.Wait != caddy.Duration(time.Second) {
		t.Errorf("Option: wait = %v, err %v", got.Wait, err)
	}
}

func TestSplitList(t *testing.T) {
	got := SplitList([]string{"a:1, b:2", "c:3\td:4", ",", "e:5"})
	if diff := cmp.Diff([]string{"a:1", "b:2", "c:3", "d:4", "e:5"}, got); diff != "" {
		t.Errorf("SplitList (-want +got):\n%s", diff)
	}
}
