// Command kubectl-watchgate is watchgate's kubectl plugin. Installed on
// the PATH (or with krew), `kubectl watchgate top` lists, per budget and
// replica, the identities with the most rejections, watch opens or open
// watches, read from each replica's top endpoint.
//
//	kubectl watchgate top [-n watchgate-system] [--budget NAME] [--sort rejections|opens|watches] [-o json]
//
// It reads the kubeconfig as kubectl does (--kubeconfig, --context, and
// the other standard flags), finds the replicas as the pods the proxy
// Service selects, reaches each one's proxy port by port-forward through
// the API server, verifies the replica's serving certificate against the
// CA watchgate publishes (ConfigMap watchgate-root-ca.crt) for the
// Service's DNS name, and sends the kubeconfig user's bearer token
// (a token, a token file or an exec plugin's); client certificates are
// not forwarded.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is stamped by make build.
var version = "dev"

const usage = `kubectl watchgate lists what watchgate's replicas see.

Usage:
  kubectl watchgate top [flags]    identities per budget and replica, by rejections, opens or open watches
  kubectl watchgate version        the plugin's version

Run "kubectl watchgate top --help" for the flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var exit exitCode
	switch {
	case errors.As(err, &exit):
		os.Exit(int(exit))
	case err != nil:
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// exitCode ends the program with that code and nothing more to print.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// run runs the subcommand args name.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitCode(2)
	}
	switch args[0] {
	case "top":
		return runTop(ctx, args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version)
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprintf(stderr, "unknown command %q\n\n%s", args[0], usage)
		return exitCode(2)
	}
}
