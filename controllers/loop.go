package controllers

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// everyInterval calls round every interval until ctx ends, logging (not
// returning) its errors with failure as the message: a failed round is
// retried on the next tick. It is the loop of the status writer and the
// pruner.
func everyInterval(ctx context.Context, c clock.WithTicker, interval time.Duration, log logr.Logger, failure string, round func(context.Context) error) {
	t := c.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			if err := round(ctx); err != nil {
				log.Error(err, failure)
			}
		}
	}
}
