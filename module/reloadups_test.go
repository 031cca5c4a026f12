package module

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestDeployReloadChangedUpstreamsAnswersAll: deploy/Caddyfile (with its
// ramjet_handover listener wrapper) under 4 clients on fresh connections
// (no keep-alive, no retries) while the admin API loads 12 configs, each
// with a different RJ_UPSTREAM list: every request gets a 200 routed by
// ramjet. Issue 15, item 5, for reloads that change the fleet (the bare
// test harness, without ramjet_handover, still loses about one request
// in 15 runs: TestReloadChangedUpstreamsLosesNoRequest).
func TestDeployReloadChangedUpstreamsAnswersAll(t *testing.T) {
	ss := startSims(t, 3, enginesim.Options{})
	d := loadDeployAdmin(t, deployCaddyfile(t), map[string]string{"RJ_UPSTREAM": ss[0].Addr() + "," + ss[1].Addr()})
	reload := func(ups string) {
		t.Setenv("RJ_UPSTREAM", ups)
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(deployCaddyfile(t)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if cfg, err = handOver(cfg, d.addrs[0], d.addrs[1], d.admin); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post("http://"+d.admin+"/load", "application/json", bytes.NewReader(cfg))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("load: %s %s", resp.Status, b)
		}
	}
	var sent, connFailed, failed atomic.Int64
	var first atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := chatBody(ss[0].Model(), false, [2]string{"user", fmt.Sprintf("w%d r%d %s", w, i, strings.Repeat("z ", 50))})
				resp, err := cl.Post(d.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				sent.Add(1)
				if err != nil {
					connFailed.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Header.Get(HeaderUpstream) == "" {
					failed.Add(1)
					first.CompareAndSwap(nil, fmt.Sprintf("%s, %s %q", resp.Status, HeaderUpstream, resp.Header.Get(HeaderUpstream)))
				}
			}
		}()
	}
	lists := []string{ss[1].Addr() + "," + ss[2].Addr(), ss[0].Addr() + "," + ss[2].Addr(), ss[0].Addr() + "," + ss[1].Addr()}
	for r := range 12 {
		mark := sent.Load()
		eventually(t, "20 more requests", func() bool { return sent.Load() >= mark+20 })
		reload(lists[r%3])
	}
	close(stop)
	wg.Wait()
	t.Logf("%d requests across 12 reloads: %d without a response, %d not a 200 routed by ramjet; first: %v",
		sent.Load(), connFailed.Load(), failed.Load(), first.Load())
	if connFailed.Load()+failed.Load() > 0 {
		t.Errorf("%d of %d requests got no response and %d failed across 12 reloads; first: %v",
			connFailed.Load(), sent.Load(), failed.Load(), first.Load())
	}
}
