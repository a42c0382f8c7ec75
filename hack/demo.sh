#!/usr/bin/env bash
echo "make demo: not yet — the demo lands with the proxy."
