package fleetsim

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
)

// Series is one named sample set of a plot.
type Series struct {
	Name   string
	Values []float64
}

// palette is a colour-blind-safe palette (Okabe-Ito, plus grey).
var palette = []string{"#D55E00", "#0072B2", "#009E73", "#E69F00", "#56B4E9", "#CC79A7", "#000000", "#999999", "#F0E442"}

// WriteCDF writes an SVG plot of the empirical CDF of every series, on a
// logarithmic x axis. The first series is drawn thickest (ramjet).
func WriteCDF(w io.Writer, title, xlabel string, series []Series) error {
	const (
		width, height                 = 820, 500
		left, right, top, bot         = 70, 190, 40, 60
		plotW, plotH                  = width - left - right, height - top - bot
		minPositive           float64 = 1e-3
	)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, v := range s.Values {
			v = math.Max(v, minPositive)
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0.01, 1
	}
	// Whole decades around the data.
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	x := func(v float64) float64 {
		v = math.Max(v, minPositive)
		return left + (math.Log10(v)-dlo)/(dhi-dlo)*plotW
	}
	y := func(p float64) float64 { return top + (1-p)*plotH }

	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	// Grid and ticks.
	for d := dlo; d <= dhi; d++ {
		xx := x(math.Pow(10, d))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", xx, top, xx, top+plotH)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", xx, top+plotH+16, tickLabel(math.Pow(10, d)))
		if d < dhi {
			for m := 2.0; m < 10; m++ {
				xm := x(m * math.Pow(10, d))
				fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#f2f2f2"/>`+"\n", xm, top, xm, top+plotH)
			}
		}
	}
	for _, p := range []float64{0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1} {
		yy := y(p)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, yy, left+plotW, yy)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, yy+4, p)
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", left+plotW/2, height-18, html.EscapeString(xlabel))
	fmt.Fprintf(b, `<text x="18" y="%d" text-anchor="middle" transform="rotate(-90 18 %d)">fraction of requests</text>`+"\n", top+plotH/2, top+plotH/2)

	for i, s := range series {
		col := palette[i%len(palette)]
		sw := 1.6
		if i == 0 {
			sw = 3
		}
		vals := slices.Clone(s.Values)
		slices.Sort(vals)
		if len(vals) > 0 {
			fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" points="`, col, sw)
			fmt.Fprintf(b, "%.1f,%.1f ", x(vals[0]), y(0))
			// A step per sample, thinned to at most ~250 steps.
			stride := max(1, len(vals)/250)
			for k := 0; k < len(vals); k += stride {
				p := float64(k+1) / float64(len(vals))
				fmt.Fprintf(b, "%.1f,%.1f %.1f,%.1f ", x(vals[k]), y(float64(k)/float64(len(vals))), x(vals[k]), y(p))
			}
			fmt.Fprintf(b, "%.1f,%.1f", x(vals[len(vals)-1]), y(1))
			fmt.Fprintln(b, `"/>`)
		}
		ly := top + 10 + i*20
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%.1f"/>`+"\n", left+plotW+14, ly, left+plotW+40, ly, col, sw)
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", left+plotW+46, ly+4, html.EscapeString(s.Name))
	}
	fmt.Fprintln(b, "</svg>")
	return b.Flush()
}

func tickLabel(v float64) string {
	if v >= 1 {
		return fmt.Sprintf("%gs", v)
	}
	return fmt.Sprintf("%gms", v*1000)
}
