// Package relay is one admitted watch's life after admission: Watch
// follows it from its decision to its end and reports that end to the
// engine exactly once; the forwarder tells it what the API server answered
// (UpstreamAnswered, UpstreamFailed); its 200 stream is relayed to the
// client (copyWatch: an idle watch waits for one byte holding no buffer)
// and read as it passes (watchBody, through proxy/internal/inspect), so
// that an ERROR 410 teaches the engine a stale version and settles the
// watch's followers (VersionVerdict). WithRelayAtTop relays from the top
// of the chain, on a small stack; OpenWatches lets shutdown close the open
// watches one by one.
//
// It does not decide whether a watch may open: proxy's admission filter
// does, then hands the watch here (NewWatch, AskFor).
package relay
