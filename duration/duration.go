package duration

import (
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration with caddy.Duration's JSON decoding.
type Duration time.Duration

// UnmarshalJSON reads a duration string (Parse) or integer nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) == 0 {
		return io.EOF
	}
	var dur time.Duration
	var err error
	if b[0] == '"' && b[len(b)-1] == '"' {
		dur, err = Parse(strings.Trim(string(b), `"`))
	} else {
		err = json.Unmarshal(b, &dur)
	}
	*d = Duration(dur)
	return err
}

// Parse reads a duration in Caddy's syntax: time.ParseDuration's, plus
// "d" for days of 24h; at most 1024 bytes (caddy.ParseDuration).
func Parse(s string) (time.Duration, error) {
	if len(s) > 1024 {
		return 0, errors.New("parsing duration: input string too long")
	}
	var inNumber bool
	var numStart int
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch == 'd' {
			days, err := strconv.ParseFloat(s[numStart:i], 64)
			if err != nil {
				return 0, err
			}
			s = s[:numStart] + strconv.FormatFloat(days*24, 'f', -1, 64) + "h" + s[i+1:]
			i--
			continue
		}
		if !inNumber {
			numStart = i
		}
		inNumber = (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '+'
	}
	return time.ParseDuration(s)
}
