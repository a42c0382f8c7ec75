// Package sampledlog is the proxy's rate-limited logger: a few lines a
// second, the rest counted (watchgate_proxy_logs_suppressed_total), and
// Bounded to cut caller-chosen strings before they enter a line. Filters
// log here because a handler has no caller to return an error to.
//
// It is not a logging framework: it wraps a logr.Logger. Every filter and
// the reverse proxy's error log use it.
package sampledlog
