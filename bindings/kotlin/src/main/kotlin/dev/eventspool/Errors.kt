package dev.eventspool

import uniffi.eventspool.SpoolException

/**
 * The errors of the Kotlin layer. The core's own refusals keep their generated types
 * ([SpoolException.InvalidEvent], [SpoolException.ShutDown], ...), so an app catches one family;
 * these are the ones only this layer can raise.
 */
sealed class EventSpoolException(message: String) : Exception(message)

/** A property value with no JSON form; [path] names it (`cart.items[2]`). Nothing was tracked. */
class PropertyException(val path: String, val reason: String) : EventSpoolException("property $path: $reason")

/**
 * The hand-off thread could not record an event the caller's `track()` had already accepted
 * (the core refused it: too large, the store failed...). It is counted in
 * [HandoffStats.rejected] under [reason] and given to `onRejected`; never dropped silently.
 */
class HandoffRejected(val eventId: String, val reason: String, override val cause: SpoolException?) :
    EventSpoolException("event $eventId refused after hand-off: $reason")
