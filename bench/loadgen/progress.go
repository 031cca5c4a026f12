package loadgen

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// IsTerminal reports whether f is a character device (a terminal), so
// that a progress bar goes only to a person watching.
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progress draws a one-line bar on w every 250ms until stop.
type progress struct {
	w     io.Writer
	total int
	agg   *aggregator
	start time.Time
	quit  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
}

func newProgress(w io.Writer, total int, agg *aggregator) *progress {
	p := &progress{w: w, total: total, agg: agg, start: time.Now(), quit: make(chan struct{})}
	if w == nil {
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				p.draw()
				fmt.Fprintln(p.w)
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

func (p *progress) draw() {
	ok := int(p.agg.completedN.Load())
	failed := int(p.agg.failedN.Load())
	done := ok + failed
	const width = 30
	fill := 0
	if p.total > 0 {
		fill = min(width, done*width/p.total)
	}
	el := time.Since(p.start)
	rate := 0.0
	if s := el.Seconds(); s > 0 {
		rate = float64(p.agg.output.Load()) / s
	}
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d done, %d failed, %.0f tok/s, %s ",
		strings.Repeat("#", fill), strings.Repeat(".", width-fill), done, p.total, failed, rate, el.Truncate(time.Second))
}

// stop ends the bar and waits for its goroutine; safe to call twice.
func (p *progress) stop() {
	p.once.Do(func() { close(p.quit) })
	p.wg.Wait()
}
