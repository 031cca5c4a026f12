// Package deploy holds ramjet's production configuration: the Caddyfile
// driven by RJ_* environment settings (see README.md beside it). It embeds
// the file so that the demo and the tests run exactly what operators run.
package deploy
