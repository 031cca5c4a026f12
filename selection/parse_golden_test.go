package selection

import (
	"bufio"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestParseGolden holds Parse to what it answered before the scanner was
// made faster (main b39feb6): a digest of every field of Features, or of
// the error (message, offset, field, kind), over the benchmark bodies,
// the fuzz seeds and corpus, the generated chat bodies in all their
// modes, every one-byte corruption and every truncation of a 2 KiB agent
// body, and six one-byte corruptions at every byte of a 1 KiB body of
// tool results dense with escapes, at four block geometries (a block smaller than the staging
// hasher's writes, the tests' 16 bytes with a short bound, the default,
// and a block larger than the gather buffer), on every endpoint.
func TestParseGolden(t *testing.T) {
	const want = 0x74a933989019cabf
	var bodies [][]byte
	add := func(s string) { bodies = append(bodies, []byte(s)) }
	add(smallChatBody)
	for _, kib := range []int{4, 64, 256} {
		add(chatBodyOfSize(kib << 10))
		add(oneStringBody(kib << 10))
		add(toolBodyOfSize(kib << 10))
	}
	tool := []byte(toolBodyOfSize(1 << 10))
	for _, dir := range []string{"FuzzParse", "FuzzParseChat"} {
		files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", dir, "*"))
		for _, name := range files {
			data, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			var vals []string
			sc := bufio.NewScanner(strings.NewReader(string(data)))
			for sc.Scan() {
				line := sc.Text()
				if k := strings.IndexByte(line, '('); k > 0 && strings.HasSuffix(line, ")") {
					vals = append(vals, line[k+1:len(line)-1])
				}
			}
			if dir == "FuzzParse" && len(vals) == 1 {
				s, err := strconv.Unquote(vals[0])
				if err != nil {
					t.Fatal(name, err)
				}
				add(s)
			}
			if dir == "FuzzParseChat" && len(vals) == 5 {
				var p [4]string
				for i := range p {
					if p[i], err = strconv.Unquote(vals[i]); err != nil {
						t.Fatal(name, err)
					}
				}
				mode, err := strconv.Unquote(vals[4])
				if r := []rune(mode); err != nil || len(r) != 1 || r[0] > 0xff {
					t.Fatal(name, vals[4], err)
				}
				add(string(chatFromParts(p[0], p[1], p[2], p[3], byte([]rune(mode)[0]))))
			}
		}
	}
	for _, p := range [][4]string{
		{"qwen3-32b", "system", "You are \"careful\".\n", "hi"},
		{"a/b", "user", "\u00e9\U0001F600", ""},
		{"", "", "", "x"},
		{"m", "user", strings.Repeat("long text with \"quotes\" and \\ slashes\t", 20), "tool"},
	} {
		for mode := 0; mode < 256; mode++ {
			bodies = append(bodies, chatFromParts(p[0], p[1], p[2], p[3], uint8(mode)))
		}
	}
	base := []byte(chatBodyOfSize(2 << 10))
	for i := range base {
		for _, c := range []byte{'"', '\\', 0x01, 0x1f, 'u', '}', ']', ',', ' ', '0', 0xff, 'n', '['} {
			m := append([]byte(nil), base...)
			m[i] = c
			bodies = append(bodies, m)
		}
		bodies = append(bodies, base[:i])
	}
	for i := range tool {
		for _, c := range []byte{'"', '\\', 0x01, 'u', 'n', '/'} {
			m := append([]byte(nil), tool...)
			m[i] = c
			bodies = append(bodies, m)
		}
	}
	var d xxhash.Digest
	d.Reset()
	var w [8]byte
	put := func(v int64) {
		binary.LittleEndian.PutUint64(w[:], uint64(v))
		_, _ = d.Write(w[:])
	}
	bytesOf := func(b []byte) {
		put(int64(len(b)))
		_, _ = d.Write(b)
	}
	for _, c := range []Config{
		{BlockTokens: 1, PrefixTokens: 1 << 20},
		testConfig(),
		{},
		{BlockTokens: 300, PrefixTokens: 300 * 40},
	} {
		c.SetDefaults()
		x := NewExtractor(c)
		f := x.NewFeatures()
		for _, body := range bodies {
			for _, ep := range fuzzEndpoints {
				err := x.Parse(ep, body, f)
				if err != nil {
					var re *RequestError
					if !errors.As(err, &re) {
						t.Fatalf("%T", err)
					}
					put(-1)
					bytesOf([]byte(re.Error()))
					put(int64(re.Offset))
					if re.Syntax {
						put(1)
					}
					continue
				}
				put(int64(f.Endpoint))
				bytesOf(f.Model)
				bytesOf(f.CacheSalt)
				if f.Stream {
					put(1)
				}
				put(int64(f.MaxTokens))
				put(int64(f.PromptBytes))
				put(int64(f.Seed))
				put(int64(len(f.Blocks)))
				for _, h := range f.Blocks {
					put(int64(h))
				}
				if f.Truncated {
					put(2)
				}
				for _, s := range []Span{f.Messages, f.Tools, f.Prompt} {
					put(int64(s.Off)<<32 | int64(s.End))
				}
			}
		}
	}
	if got := d.Sum64(); got != want {
		t.Fatalf("digest of %d bodies %#x, want %#x", len(bodies), got, uint64(want))
	}
}
