// Package logtest makes loggers for tests.
package logtest
