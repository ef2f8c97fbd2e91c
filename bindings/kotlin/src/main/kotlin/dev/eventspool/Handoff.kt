package dev.eventspool

import java.time.Instant
import java.util.concurrent.ArrayBlockingQueue
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicLong
import kotlinx.serialization.json.JsonObject
import kotlinx.serialization.json.JsonPrimitive
import uniffi.eventspool.EventSpool
import uniffi.eventspool.NewEvent
import uniffi.eventspool.SpoolException

/**
 * The bounded hand-off between `track()` and the core.
 *
 * Why: one call through the generated bindings costs tens of microseconds of JNA marshalling,
 * too much for a UI thread. `track()` only puts a small record here (the id and timestamp are
 * already fixed, so they never change later); one background thread takes everything waiting
 * and records it with a single `track_batch` call, so the FFI cost is paid once per batch.
 *
 * Bounded: at most [capacity] records. When it is full, `track()` waits for room (the
 * back-pressure is counted in [HandoffStats.waits]); nothing is dropped to make room.
 * What a crash can lose: the records still here, at most [capacity]: at an app's rate the
 * events of the last `track_batch` call (a few ms), under a burst that fills the queue as long
 * as the core takes to record [capacity] events (about 170 ms on the bench machine, see
 * BENCHMARKS.md); on top of what the core itself holds in memory under `durability = spill`.
 */
internal class Handoff(
    private val core: EventSpool,
    val capacity: Int,
    private val maxBatch: Int,
    private val onRejected: (HandoffRejected) -> Unit,
) {
    class Pending(val name: String, val properties: JsonObject, val id: String, val timestampMs: Long)

    private val queue = ArrayBlockingQueue<Pending>(capacity)
    /** Counted before the record goes in, so a waiter's target covers every `track()` that returned. */
    private val reserved = AtomicLong()
    private val handed = AtomicLong()
    private val waits = AtomicLong()
    private val batches = AtomicLong()
    private val rejected = ConcurrentHashMap<String, AtomicLong>()
    private val monitor = Object()
    private val sendLock = Object()
    @Volatile private var closed = false
    private val thread = Thread(::run, "eventspool-handoff").apply {
        isDaemon = true
        start()
    }

    fun offer(p: Pending) {
        reserved.incrementAndGet()
        if (!queue.offer(p)) {
            waits.incrementAndGet()
            queue.put(p)
        }
        // Lost the race with close(): the thread may be gone, so hand this one over here.
        if (closed) drainHere()
    }

    /** Waits until every record offered before this call reached the core (or was rejected, counted). */
    fun awaitHandedOff(timeoutMs: Long): Boolean {
        val target = reserved.get()
        val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs)
        synchronized(monitor) {
            while (handed.get() < target) {
                val left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())
                if (left <= 0) return false
                monitor.wait(left)
            }
        }
        return true
    }

    /** Stops the thread after it handed over what is queued; later records are handed by their callers. */
    fun close(timeoutMs: Long) {
        closed = true
        thread.join(timeoutMs.coerceAtLeast(1))
        drainHere()
    }

    fun stats() = HandoffStats(
        queued = queue.size.toLong(),
        handedOff = handed.get(),
        batches = batches.get(),
        waits = waits.get(),
        rejected = rejected.mapValues { it.value.get() },
    )

    private fun run() {
        val batch = ArrayList<Pending>(maxBatch)
        // Bounded by `closed`: the poll wakes at least every 100 ms to look at it.
        while (true) {
            val first = try {
                queue.poll(100, TimeUnit.MILLISECONDS)
            } catch (e: InterruptedException) {
                null
            }
            if (first == null) {
                if (closed && queue.isEmpty()) return
                continue
            }
            batch.add(first)
            queue.drainTo(batch, maxBatch - 1)
            send(batch)
            batch.clear()
        }
    }

    private fun drainHere() {
        val batch = ArrayList<Pending>()
        while (queue.drainTo(batch, maxBatch) > 0) {
            send(batch)
            batch.clear()
        }
    }

    private fun send(batch: List<Pending>) {
        synchronized(sendLock) {
            try {
                val lines = StringBuilder(batch.size * 320)
                for (p in batch) lines.append(line(p)).append('\n')
                core.trackBatch(lines.toString())
            } catch (e: Throwable) {
                // All or none refused: record them one by one so one bad event costs only itself.
                for (p in batch) one(p)
            }
            batches.incrementAndGet()
            handed.addAndGet(batch.size.toLong())
        }
        synchronized(monitor) { monitor.notifyAll() }
    }

    private fun one(p: Pending) {
        try {
            core.trackEvent(NewEvent(name = p.name, propertiesJson = p.properties.toString(), eventId = p.id, timestamp = timestamp(p.timestampMs)))
        } catch (e: Throwable) {
            val reason = when (e) {
                is SpoolException.EventTooLarge -> "event_too_large"
                is SpoolException.InvalidEvent -> "invalid_event"
                is SpoolException.TrackingDisabled -> "tracking_disabled"
                is SpoolException.ShutDown -> "shut_down"
                is SpoolException.Storage -> "storage"
                is SpoolException.NotDurable -> return // kept in memory and delivered: not a loss
                else -> "internal"
            }
            rejected.computeIfAbsent(reason) { AtomicLong() }.incrementAndGet()
            runCatching { onRejected(HandoffRejected(p.id, reason, e as? SpoolException)) }
        }
    }

    private fun line(p: Pending): String = JsonObject(
        mapOf(
            "name" to JsonPrimitive(p.name),
            "properties" to p.properties,
            "event_id" to JsonPrimitive(p.id),
            "timestamp" to JsonPrimitive(timestamp(p.timestampMs)),
        ),
    ).toString()

    private fun timestamp(ms: Long) = Instant.ofEpochMilli(ms).toString()
}

/** What the hand-off did: [waits] counts `track()` calls that waited for room (back-pressure). */
data class HandoffStats(
    val queued: Long,
    val handedOff: Long,
    val batches: Long,
    val waits: Long,
    /** Events the core refused after `track()` had returned, by reason; each went to `onRejected`. */
    val rejected: Map<String, Long>,
)
