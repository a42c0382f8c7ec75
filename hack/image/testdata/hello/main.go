// Command hello stands in for watchgate in the image builder's tests: a
// main package with a version to stamp and one dependency to list.
package main

import (
	"fmt"

	"example.com/greeting"
)

var version = "dev"

func main() { fmt.Println(greeting.Hello, version) }
