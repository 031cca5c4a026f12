package usage

import (
	"bytes"
	"sync"
	"sync/atomic"

	"github.com/ramjet-llm/ramjet/selection"
)

// shape is the layout of a usage object an engine sent, so that the next
// one laid out alike is read without walking its JSON: the object's bytes
// with each integer value cut out (lits[i] comes before integer i,
// lits[len(lits)-1] after the last) and, for each integer, the count of
// usageFields it sets (-1: none; a member nothing reads, or one a later
// duplicate overrides) and its sign.
//
// An object that is lits with valid JSON integers (at most 18 digits, no
// leading zero) in between is the learned object with other integers in
// the same places: valid JSON of the same structure and keys, which
// usageSet.IntsObject decides alike, setting each count from the same
// integer (the mapping is IntsObject's own, learned by decoding a probe:
// learnShape).
type shape struct {
	lits  [][]byte
	field []int8
	neg   []bool
}

// maxShapes bounds the layouts kept (an engine sends one or two: with and
// without the cached count); later ones are read as before.
const maxShapes = 8

// Layouts reports how many answer layouts the process keeps and their
// bound (MaxLayouts), for the metrics (ramjet_usage_layouts).
func Layouts() int {
	if p := shapes.Load(); p != nil {
		return len(*p)
	}
	return 0
}

// MaxLayouts is the most answer layouts kept (maxShapes).
const MaxLayouts = maxShapes

// maxSlots bounds the integers of a kept layout.
const maxSlots = 32

// shapes holds the layouts learned, copied on write (shapesMu).
var (
	shapes   atomic.Pointer[[]*shape]
	shapesMu sync.Mutex
)

// matchShapes reads the usage object that starts p with a learned layout
// into out (usageFields' order; counts it has no integer for are left as
// they are), and returns the index just past it; false when none fits.
func matchShapes(p []byte, out *[6]int64) (end int, ok bool) {
	ss := shapes.Load()
	if ss == nil {
		return 0, false
	}
	for _, sh := range *ss {
		if end, ok = sh.match(p, out); ok {
			return end, true
		}
	}
	return 0, false
}

// match reads p's leading object with sh's layout (see shape). out is
// written only when it fits.
func (sh *shape) match(p []byte, out *[6]int64) (end int, ok bool) {
	vals := *out // written back only when all of p fits
	i := 0
	last := len(sh.lits) - 1
	for s, lit := range sh.lits[:last] {
		if len(p)-i < len(lit) || string(p[i:i+len(lit)]) != string(lit) {
			return 0, false
		}
		i += len(lit)
		var v int64
		j := i
		for ; j < len(p) && j-i <= 18; j++ {
			d := p[j] - '0'
			if d > 9 {
				break
			}
			v = v*10 + int64(d)
		}
		if n := j - i; n == 0 || n > 18 || n > 1 && p[i] == '0' {
			return 0, false
		}
		if f := sh.field[s]; f >= 0 {
			if sh.neg[s] {
				v = -v
			}
			vals[f] = v
		}
		i = j
	}
	if lit := sh.lits[last]; len(p)-i < len(lit) || string(p[i:i+len(lit)]) != string(lit) {
		return 0, false
	}
	*out = vals
	return i + len(sh.lits[last]), true
}

// learnShape keeps obj's layout, obj being a usage object IntsObject
// decided (all of it: nothing follows), unless maxShapes are kept already
// or the layout is not one match can read.
func learnShape(obj []byte) {
	if p := shapes.Load(); p != nil && len(*p) >= maxShapes {
		return // full: no allocation for the objects no layout fits
	}
	sh := cutIntegers(obj)
	if sh == nil || !sh.mapFields() {
		return
	}
	shapesMu.Lock()
	defer shapesMu.Unlock()
	var old []*shape
	if p := shapes.Load(); p != nil {
		old = *p
	}
	if len(old) >= maxShapes {
		return
	}
	for _, o := range old {
		if o.same(sh) {
			return
		}
	}
	ss := append(append(make([]*shape, 0, len(old)+1), old...), sh)
	shapes.Store(&ss)
}

// same reports that sh and o have one layout.
func (sh *shape) same(o *shape) bool {
	if len(sh.lits) != len(o.lits) {
		return false
	}
	for i := range sh.lits {
		if !bytes.Equal(sh.lits[i], o.lits[i]) || i < len(sh.neg) && sh.neg[i] != o.neg[i] {
			return false
		}
	}
	return true
}

// cutIntegers cuts the integers out of obj, valid JSON: every number
// token outside strings that is -?[0-9]+ becomes an integer of the layout
// (its sign stays in the bytes before it); other numbers stay bytes.
// nil when obj has more than maxSlots integers.
func cutIntegers(obj []byte) *shape {
	sh := &shape{}
	from := 0
	for i := 0; i < len(obj); i++ {
		c := obj[i]
		switch {
		case c == '"':
			end, ok := selection.StringEnd(obj, i)
			if !ok {
				return nil
			}
			i = end - 1
			continue
		case c != '-' && (c < '0' || c > '9'):
			continue
		}
		// A number token starts at i: it runs over [0-9+-.eE].
		j := i
		for j < len(obj) && (obj[j] >= '0' && obj[j] <= '9' || obj[j] == '-' || obj[j] == '+' || obj[j] == '.' || obj[j] == 'e' || obj[j] == 'E') {
			j++
		}
		d := i
		if c == '-' {
			d++
		}
		integer := d < j
		for k := d; k < j; k++ {
			if obj[k] < '0' || obj[k] > '9' {
				integer = false
			}
		}
		if integer {
			if len(sh.neg) == maxSlots {
				return nil
			}
			sh.lits = append(sh.lits, bytes.Clone(obj[from:d])) // own copies: obj is the scanner's buffer
			sh.neg = append(sh.neg, c == '-')
			from = j
		}
		i = j - 1
	}
	sh.lits = append(sh.lits, bytes.Clone(obj[from:]))
	return sh
}

// probeBase is the value of integer s in the probe mapFields decodes:
// probeBase+s, 12 digits, larger than any count an object of the layout
// sets otherwise (every integer of the probe is one of these).
const probeBase = 100_000_000_000

// mapFields finds which count each integer sets, as IntsObject has it:
// it decodes the layout with integer s set to probeBase+s and reads back
// which integer each count took. false when the probe is not decided or a
// count took something else (then the layout is not kept).
func (sh *shape) mapFields() bool {
	last := len(sh.lits) - 1
	var probe []byte
	for s := range last {
		probe = append(probe, sh.lits[s]...)
		probe = appendInt(probe, probeBase+int64(s))
	}
	probe = append(probe, sh.lits[last]...)
	out := [6]int64{absent, absent, absent, absent, absent, absent}
	end, ok := usageSet.IntsObject(probe, out[:])
	if !ok || end != len(probe) {
		return false
	}
	sh.field = make([]int8, last)
	for s := range sh.field {
		sh.field[s] = -1
	}
	for k, v := range out {
		if v == absent {
			continue
		}
		s := v - probeBase
		if v < 0 {
			s = -v - probeBase
		}
		if s < 0 || s >= int64(last) || sh.field[s] >= 0 || sh.neg[s] != (v < 0) {
			return false
		}
		sh.field[s] = int8(k)
	}
	return true
}

// appendInt appends v (non-negative) in decimal.
func appendInt(b []byte, v int64) []byte {
	var d [20]byte
	i := len(d)
	for {
		i--
		d[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(b, d[i:]...)
}
