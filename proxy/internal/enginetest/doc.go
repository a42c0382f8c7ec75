// Package enginetest is a fake ratelimit engine for tests: it decides as
// told and records what the proxy told it. Only tests import it.
package enginetest
