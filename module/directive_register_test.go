package module_test

// The tests of package module adapt Caddyfiles using the ramjet directive:
// the directive package (which imports module) registers it in this test
// binary.
import _ "github.com/ramjet-llm/ramjet/directive"
