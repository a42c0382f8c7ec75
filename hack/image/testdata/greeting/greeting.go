// Package greeting is the test program's one dependency.
package greeting

// Hello is what the test program prints.
const Hello = "hello"
