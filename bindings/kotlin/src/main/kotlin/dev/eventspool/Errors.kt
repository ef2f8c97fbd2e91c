package dev.eventspool

import uniffi.eventspool.SpoolException

/**
 * The errors of the Kotlin layer. The core's own refusals keep their generated types
 * ([SpoolException.InvalidEvent], [SpoolException.ShutDown], ...), so an app catches one family;
 * these are the ones only this layer can raise. `track()` raises none of them unless the spool
 * was made `strict` (debug builds): it counts and logs instead.
 */
sealed class EventSpoolException(message: String, cause: Throwable? = null) : Exception(message, cause)

/** A property value with no JSON form; [path] names it (`cart.items[2]`). Nothing was tracked. */
class PropertyException(val path: String, val reason: String) : EventSpoolException("property $path: $reason")

/**
 * The spool is not open and will not be: its open failed ([SpoolHealth.Failed]) or this process
 * does not track ([SpoolHealth.Inactive]). [reason] says which and why.
 */
class SpoolUnavailable(val reason: String, cause: Throwable? = null) : EventSpoolException("eventspool is not available: $reason", cause)

/**
 * The core refused an event after `track()` had returned (too large, a name the collector drops,
 * the store failed...). It is counted in [HandoffStats.rejected] under [reason] and given to
 * `onRejected`; never dropped silently. [message] is the core's own text.
 */
class HandoffRejected(val eventId: String, val reason: String, override val message: String) :
    EventSpoolException("event $eventId refused after hand-off: $reason: $message")
