package admit

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/ratelimit"
)

// watchListRefused is the answer to a watch-list refused because the
// identity's watch-lists of its resource keep ending without the bookmark
// that ends their initial events (ratelimit.ReasonWatchListIncomplete):
// 422 Invalid on ListOptions' sendInitialEvents, what kube-apiserver
// answers when it does not serve watch-lists. client-go's reflector takes
// any error of a watch-list that is not a 429, a refused connection or a
// 410 as "watch-list not supported" and falls back to a LIST and a WATCH
// from the list's version, which the same API server serves; a 429 would
// only make it try the watch-list again.
func watchListRefused(d ratelimit.Decision) *apierrors.StatusError {
	msg := fmt.Sprintf("%s (watchgate budget %q: %d in a row); watch-lists of this resource are refused for %ds",
		d.Reason.Text(), d.Budget, ratelimit.IncompleteWatchListLimit, answer.RetryAfterSeconds(d.RetryAfter))
	return apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "",
		field.ErrorList{field.Forbidden(field.NewPath("sendInitialEvents"), msg)})
}
