package eventspool

import dev.eventspool.HandoffRejected
import dev.eventspool.PropertyException
import dev.eventspool.Spool
import java.nio.file.Path
import java.util.UUID
import java.util.concurrent.CopyOnWriteArrayList
import kotlinx.coroutines.flow.first
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.AfterEach
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.BeforeEach
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import org.junit.jupiter.api.io.TempDir
import uniffi.eventspool.DeferReason
import uniffi.eventspool.DeliveryConditions
import uniffi.eventspool.DeliveryState
import uniffi.eventspool.DrainOutcome
import uniffi.eventspool.SpoolException

/** The hand-written Kotlin layer (dev.eventspool) against the real library and a collector process. */
class LayerTest {
    @TempDir
    lateinit var dir: Path
    private lateinit var collector: CollectorProcess
    private val db get() = dir.resolve("events.db")

    @BeforeEach
    fun startCollector() {
        collector = CollectorProcess(dir.resolve("collector.db")).start()
    }

    @AfterEach
    fun stopCollector() = collector.stop()

    private fun props(i: Int): Map<String, Any?> = mapOf(
        "screen" to "s-${i % 7}", "i" to i, "ratio" to i / 3.0, "ok" to (i % 2 == 0), "none" to null,
        "tags" to listOf("a", "b"), "cart" to mapOf("items" to listOf(1, 2, 3), "total" to 12.5),
    )

    @Test
    fun `deliverWithin hands over what track accepted, is Blocked while deferred, Drained after`() {
        Spool(fastConfig(collector.url, db).apply { deliverOnMetered = false }).use { spool ->
            spool.setConditions(DeliveryConditions(metered = true))
            repeat(40) { spool.track("job", props(it)) }
            val blocked = runBlocking { spool.deliverWithin(5_000) }
            assertTrue(blocked is DrainOutcome.Blocked, "$blocked")
            assertEquals(DeliveryState.Deferred(DeferReason.METERED), (blocked as DrainOutcome.Blocked).status.state)
            assertEquals(40uL, blocked.status.pending, "the 40 were handed over before the drain")
            assertEquals(0L, collector.requests())

            spool.setConditions(DeliveryConditions(metered = false))
            assertEquals(DrainOutcome.Drained, spool.deliverWithinBlocking(20_000))
            assertEquals(40L, collector.distinct())
        }
    }

    @Test
    fun `track with a map hands off, then delivers each event once under its returned id`() {
        Spool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            val ids = (0 until 300).map { spool.track("screen_view", props(it)) }
            assertEquals(300, ids.toSet().size)
            ids.forEach { assertEquals(7, UUID.fromString(it!!).version()) }
            val stats = spool.statsBlocking() // waits for the hand-off first
            assertEquals(300uL, stats.tracked)
            assertEquals(300L, spool.handoffStats().handedOff)
            assertTrue(spool.handoffStats().batches < 300, "batched: ${spool.handoffStats()}")
            assertTrue(spool.state().state is DeliveryState.Offline)

            spool.setOnline(true)
            assertTrue(runBlocking { spool.awaitDrained(20_000) })
            assertEquals(300L, collector.distinct())
            assertEquals(300uL, spool.statsBlocking().delivered)
        }
    }

    @Test
    fun `the StateFlow follows the worker from Offline to Idle with nothing pending`() {
        Spool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            assertTrue(spool.status.value.state is DeliveryState.Offline, "${spool.status.value}")
            repeat(20) { spool.track("tap", mapOf("n" to it)) }
            runBlocking {
                spool.flush()
                withTimeout(20_000) { spool.status.first { it.pending == 20uL } }
                spool.setOnline(true)
                val idle = withTimeout(20_000) { spool.status.first { it.state is DeliveryState.Idle && it.pending == 0uL } }
                assertEquals(0uL, idle.pending)
            }
            assertEquals(20L, collector.distinct())
        }
    }

    @Test
    fun `a value with no JSON form is refused with its path, nothing tracked (strict)`() {
        Spool(fastConfig(collector.url, db), strict = true).use { spool ->
            val e = assertThrows<PropertyException> {
                spool.track("cart", mapOf("cart" to mapOf("items" to listOf(1, Thread.currentThread()))))
            }
            assertEquals("cart.items[1]", e.path)
            assertEquals("ratio", assertThrows<PropertyException> { spool.track("x", mapOf("ratio" to Double.NaN)) }.path)
            assertThrows<SpoolException.InvalidEvent> { spool.track("", mapOf()) }
            assertEquals(0uL, spool.statsBlocking().tracked)
        }
    }

    @Test
    fun `a full hand-off makes track wait on a thread that may wait, it never drops there`() {
        Spool(fastConfig(collector.url, db), startOffline = true, handoffCapacity = 4, mayWait = { true }).use { spool ->
            repeat(2_000) { spool.track("burst", mapOf("i" to it)) }
            val stats = spool.statsBlocking()
            assertEquals(2_000uL, stats.tracked)
            val handoff = spool.handoffStats()
            assertTrue(handoff.waits > 0, "capacity 4 against 2,000 calls must have pushed back: $handoff")
            assertEquals(emptyMap<String, Long>(), handoff.rejected)
            spool.setOnline(true)
            assertTrue(spool.waitDrainedBlocking(20_000))
            assertEquals(2_000L, collector.distinct())
        }
    }

    @Test
    fun `the layer's default commits on the hand-off thread, trackDurably returns once stored`() {
        Spool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            repeat(4) { spool.track("paid", mapOf("i" to it)) }
            val id = runBlocking { spool.trackDurably("paid", mapOf("i" to 4)) }
            assertTrue(id != null)
            // Straight to the core, no hand-off wait: the hand-off thread committed all five.
            val stats = spool.core.stats()
            assertEquals(5uL, stats.tracked)
            assertEquals(5uL, stats.pendingDisk)
            assertEquals(5L, spool.handoffStats().handedOff)
        }
    }

    @Test
    fun `durability spill when the config says so - the events stay in memory`() {
        Spool(fastConfig(collector.url, db).copy(durability = "spill"), startOffline = true).use { spool ->
            repeat(5) { spool.track("light", mapOf("i" to it)) }
            val stats = spool.statsBlocking()
            assertEquals(5uL, stats.tracked)
            assertEquals(0uL, stats.pendingDisk)
        }
    }

    @Test
    fun `an event the core refuses after hand-off is counted and reported, the rest are recorded`() {
        val rejected = CopyOnWriteArrayList<HandoffRejected>()
        Spool(fastConfig(collector.url, db), startOffline = true, onRejected = { rejected.add(it) }).use { spool ->
            spool.track("before", mapOf())
            val big = spool.track("big", mapOf("blob" to "x".repeat(40_000)))
            spool.track("after", mapOf())
            assertEquals(2uL, spool.statsBlocking().tracked)
            assertEquals(mapOf("event_too_large" to 1L), spool.handoffStats().rejected)
            assertEquals(listOf(big), rejected.map { it.eventId })
            assertEquals("event_too_large", rejected.single().reason)
            assertTrue(rejected.single().message.contains("max_event_bytes"), rejected.single().message)
        }
    }

    @Test
    fun `suspend shutdown hands over the rest and later calls raise ShutDown`() {
        Spool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            repeat(50) { spool.track("late", mapOf("i" to it)) }
            runBlocking { spool.shutdown(5_000) }
            assertEquals(null, spool.track("later", mapOf()))
            assertEquals(mapOf("shut_down" to 1L), spool.handoffStats().refused)
            assertEquals(50uL, spool.core.stats().tracked)
        }
        // Persisted at shutdown: a new spool on the same file delivers all 50.
        Spool(fastConfig(collector.url, db)).use { again ->
            assertEquals(50uL, again.core.stats().restored)
            again.flushBlocking()
            assertTrue(again.waitDrainedBlocking(20_000))
            assertEquals(50L, collector.distinct())
        }
    }
}
