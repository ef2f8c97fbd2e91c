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
 * then once per [LOG_EVERY] (a tight loop of refused calls must not flood the log).
 */
internal class Refusals(private val what: String, private val logger: SpoolLogger) {
    private val counts = ConcurrentHashMap<String, AtomicLong>()

    fun count(reason: String, events: Long = 1, detail: () -> String) {
        val after = counts.computeIfAbsent(reason) { AtomicLong() }.addAndGet(events)
        val before = after - events
        if (before == 0L || before / LOG_EVERY != after / LOG_EVERY) {
            runCatching { logger.log(SpoolLogger.Level.WARN, "eventspool: $what ($reason, $after so far): ${detail()}", null) }
        }
    }

    fun snapshot(): Map<String, Long> = counts.mapValues { it.value.get() }

    companion object {
        const val LOG_EVERY = 1_000L
    }
}
