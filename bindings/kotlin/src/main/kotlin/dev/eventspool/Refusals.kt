package dev.eventspool

import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.atomic.AtomicLong

/** Where the layer's log lines go: `java.util.logging` on a JVM, logcat from the Android layer. */
fun interface SpoolLogger {
    fun log(level: Level, message: String, error: Throwable?)

    enum class Level { INFO, WARN, ERROR }

    companion object {
        val JavaLogging = SpoolLogger { level, message, error ->
            val logger = java.util.logging.Logger.getLogger("eventspool")
            val l = when (level) {
                Level.INFO -> java.util.logging.Level.INFO
                Level.WARN -> java.util.logging.Level.WARNING
                Level.ERROR -> java.util.logging.Level.SEVERE
            }
            logger.log(l, message, error)
        }
    }
}

/**
 * Events that were not recorded, counted by reason, each reason logged at its first event and
 * then at most once per [LOG_INTERVAL_MS] with the count so far: a tight loop of refused calls on
 * a UI thread must neither flood the log nor pay for a log line every so many calls (a line costs
 * ~100 us, which would be the calls' p99.9).
 */
internal class Refusals(private val what: String, private val logger: SpoolLogger) {
    private class Count {
        val events = AtomicLong()
        val loggedAtMs = AtomicLong(Long.MIN_VALUE)
    }

    private val counts = ConcurrentHashMap<String, Count>()

    fun count(reason: String, events: Long = 1, detail: () -> String) {
        val c = counts[reason] ?: counts.computeIfAbsent(reason) { Count() }
        val after = c.events.addAndGet(events)
        val last = c.loggedAtMs.get()
        val now = if (last == Long.MIN_VALUE) 0L else System.currentTimeMillis()
        if ((last == Long.MIN_VALUE || now - last >= LOG_INTERVAL_MS) && c.loggedAtMs.compareAndSet(last, System.currentTimeMillis())) {
            runCatching { logger.log(SpoolLogger.Level.WARN, "eventspool: $what ($reason, $after so far): ${detail()}", null) }
        }
    }

    fun snapshot(): Map<String, Long> = counts.mapValues { it.value.events.get() }

    companion object {
        const val LOG_INTERVAL_MS = 60_000L
    }
}
