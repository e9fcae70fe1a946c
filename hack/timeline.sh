# Sourced by the set-up scripts. timeline_record NAME START (epoch seconds, `date +%s.%N`): a finished step, added
# to the timeline of the `make test` run in progress (tools/testenv/src/epd_testenv/timeline.py); outside one, nothing.
timeline_record() {
  [ -n "${EPD_TIMELINE:-}" ] || return 0
  python3 "$(dirname "${BASH_SOURCE[0]}")/../tools/testenv/src/epd_testenv/timeline.py" record "$1" "$2"
}
