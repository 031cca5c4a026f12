package kvindex

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFeedOptions(t *testing.T) {
	var o FeedOptions
	for name, args := range map[string][]string{
		"kv_events": {"a:1=tcp://a:5557", "b:2=tcp://b:5557"},
		"kv_replay": {"a:1=tcp://a:5558"},
		"kv_topic":  {"kv"},
	} {
		if ok, err := o.Set(name, args); !ok || err != nil {
			t.Fatalf("Set(%s) = %v, %v", name, ok, err)
		}
	}
	if ok, _ := o.Set("kv_block_size", []string{"16"}); ok {
		t.Error("Set took an option that is not a feed's")
	}
	got, err := o.Feeds([]string{"a:1", "b:2", "c:3"}, []string{"http", "https", "http"}, []int{2, 1, 1})
	if err != nil {
		t.Fatal(err)
	}
	want := []FeedSpec{
		{Upstream: "a:1", Events: "tcp://a:5557", Replay: "tcp://a:5558", Ranks: 2},
		{Upstream: "b:2", Events: "tcp://b:5557", Scheme: "https"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Feeds (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		o    FeedOptions
		want string
	}{
		{FeedOptions{Events: map[string]string{"x:1": "tcp://x:1"}}, "not one of the upstreams"},
		{FeedOptions{Events: map[string]string{"a:1": "tcp://a:1"}, Bind: "tcp://r:1"}, "exclusive"},
		{FeedOptions{Bind: "tcp://r:1"}, "needs its topic"},
	} {
		if _, err := tc.o.Feeds([]string{"a:1", "b:2"}, []string{"http", "http"}, []int{1, 1}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Feeds(%+v) = %v, want %q", tc.o, err, tc.want)
		}
	}
	if _, err := ParsePairs("kv_events", []string{"a:1=x", "a:1=y"}); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("ParsePairs twice: %v", err)
	}
}

// TestParseFeedLine: the policy's kv_events line, with and without the
// dial|bind word and the replay address; a wrong count is an error and the
// caller's arguments are left as given.
func TestParseFeedLine(t *testing.T) {
	for _, tt := range []struct {
		name    string
		give    []string
		want    FeedSpec
		wantErr bool
	}{
		{name: "dial", give: []string{"a:1", "tcp://a:5557"}, want: FeedSpec{Upstream: "a:1", Events: "tcp://a:5557"}},
		{name: "replay", give: []string{"a:1", "tcp://a:5557", "tcp://a:5558"},
			want: FeedSpec{Upstream: "a:1", Events: "tcp://a:5557", Replay: "tcp://a:5558"}},
		{name: "bind", give: []string{"*", "bind", "tcp://*:5557"}, want: FeedSpec{Upstream: "*", Events: "tcp://*:5557", Bind: true}},
		{name: "explicit dial", give: []string{"a:1", "dial", "tcp://a:5557", "tcp://a:5558"},
			want: FeedSpec{Upstream: "a:1", Events: "tcp://a:5557", Replay: "tcp://a:5558"}},
		{name: "no events", give: []string{"a:1"}, wantErr: true},
		{name: "bind without events", give: []string{"a:1", "bind"}, wantErr: true},
		{name: "too many", give: []string{"a:1", "e", "r", "x"}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			give := append([]string(nil), tt.give...)
			got, err := ParseFeedLine(give)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				if !strings.Contains(err.Error(), "want <upstream> [dial|bind] <events> [<replay>]") {
					t.Errorf("error = %v", err)
				}
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseFeedLine(%q) (-want +got):\n%s", tt.give, diff)
			}
			if diff := cmp.Diff(tt.give, give); diff != "" {
				t.Errorf("arguments changed (-want +got):\n%s", diff)
			}
		})
	}
}
