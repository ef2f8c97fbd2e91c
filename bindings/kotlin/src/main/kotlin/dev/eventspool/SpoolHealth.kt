package dev.eventspool

/**
 * Whether the spool itself is there, apart from how delivery goes ([Spool.status]): the open
 * happens on a background thread, and an open that fails must be visible without having thrown
 * into the app. While it is not [Ready], `track()` is a counted no-op or waits in the bounded
 * pre-open queue ([Opening]).
 */
sealed class SpoolHealth {
    /** The library is being loaded and the store opened; `track()` queues (bounded). */
    object Opening : SpoolHealth() {
        override fun toString() = "Opening"
    }

    object Ready : SpoolHealth() {
        override fun toString() = "Ready"
    }

    /**
     * The open failed: a missing native library for this ABI, the store held by another process,
     * a lost encryption key under `onKeyLost = Fail`, a disk error. Nothing is tracked (each call
     * counted as `spool_failed`); [reason] is the text to log or show.
     */
    data class Failed(val reason: String, val cause: Throwable? = null) : SpoolHealth()

    /** This process does not track (a second process of the app with no store of its own). */
    data class Inactive(val reason: String) : SpoolHealth()
}
