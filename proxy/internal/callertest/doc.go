// Package callertest holds the callers of tests and the fakes that
// authenticate and authorize them: Tokens knows alice and the agent,
// Impersonation lets the agent impersonate bob, Access lets alice read the
// top endpoint. Only tests import it.
package callertest
