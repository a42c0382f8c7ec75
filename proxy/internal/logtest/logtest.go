package logtest

import (
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
)

// Discard is a sampled logger that drops every line, with room for a
// test's worth of them.
func Discard() *sampledlog.Logger { return sampledlog.New(logr.Discard(), 1000, 1000) }

// Func is a logger that calls f with each line's arguments.
func Func(f func(msg string)) logr.Logger {
	return funcr.New(func(_, args string) { f(args) }, funcr.Options{})
}
