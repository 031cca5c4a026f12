package metrics

import (
	"reflect"
	"testing"
	"time"
	"unsafe"
)

// TestResponseResetClearsEveryField: Reset clears Response field by field
// (to keep its scanner's buffers without copying it out and back), so a
// field added later must be cleared there too. Every field but the
// scanner is set to a non-zero value, and must be zero after Reset.
func TestResponseResetClearsEveryField(t *testing.T) {
	var o Response
	v := reflect.ValueOf(&o).Elem()
	for i := range v.NumField() {
		if v.Type().Field(i).Name == "usage" {
			continue // Reset's own (usage.Scanner.Reset, tested there)
		}
		f := v.Field(i)
		setNonZero(t, v.Type().Field(i).Name, reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem())
	}
	o.Reset()
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; name != "usage" && !v.Field(i).IsZero() {
			t.Errorf("Response.%s is %v after Reset, want zero: clear it in Reset", name, v.Field(i))
		}
	}
}

// setNonZero gives f a non-zero value of its kind.
func setNonZero(t *testing.T, name string, f reflect.Value) {
	t.Helper()
	switch {
	case f.Type() == reflect.TypeFor[time.Time]():
		f.Set(reflect.ValueOf(time.Now()))
	case f.Kind() == reflect.Int:
		f.SetInt(3)
	case f.Kind() == reflect.Bool:
		f.SetBool(true)
	case f.Kind() == reflect.Array && f.Len() > 0 && f.Index(0).Kind() == reflect.Uint8:
		f.Index(0).SetUint(1)
	default:
		t.Fatalf("field %s (%s): teach this test to set it", name, f.Type())
	}
}
