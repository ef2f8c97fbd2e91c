package eventspool

import dev.eventspool.Spool
import java.nio.file.Path
import java.time.Duration
import java.time.Instant
import java.util.Date
import dev.eventspool.PropertyException
import java.util.concurrent.CopyOnWriteArrayList
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import org.junit.jupiter.api.AfterEach
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTimeoutPreemptively
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.BeforeEach
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertDoesNotThrow
import org.junit.jupiter.api.assertThrows
import org.junit.jupiter.api.function.ThrowingSupplier
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.io.TempDir
import uniffi.eventspool.Consent

/**
 * What the host app can count on from the Kotlin layer: `track()` never throws and never waits;
 * what it refuses is counted by reason.
 */
class HostSafetyTest {
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

    enum class Plan { FREE, PRO }

    @Test
    fun `track never throws - disabled, empty name, a value with no JSON form`() {
        Spool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            assertEquals(null, assertDoesNotThrow<String?> { spool.track("", mapOf()) })
            assertEquals(null, assertDoesNotThrow<String?> { spool.track("x", mapOf("t" to Thread.currentThread())) })
            assertTrue(spool.track("kept", mapOf()) != null)
            spool.setEnabled(false)
            assertEquals(null, assertDoesNotThrow<String?> { spool.track("after_opt_out", mapOf()) })
            assertEquals(
                mapOf("invalid_event" to 1L, "invalid_property" to 1L, "tracking_disabled" to 1L),
                spool.handoffStats().refused,
            )
            assertEquals(1uL, spool.statsBlocking().tracked)
        }
        // A debug build's spool throws instead, so a bad call shows at once.
        Spool(fastConfig(collector.url, dir.resolve("strict.db")), startOffline = true, strict = true).use { spool ->
            assertThrows<PropertyException> { spool.track("x", mapOf("t" to Thread.currentThread())) }
        }
    }

    @Test
    fun `NaN and Infinity are refused by name, without an exception`() {
        val logged = CopyOnWriteArrayList<String>()
        Spool(fastConfig(collector.url, db), startOffline = true, logger = { _, message, _ -> logged += message }).use { spool ->
            assertEquals(null, assertDoesNotThrow<String?> { spool.track("x", mapOf("score" to Double.NaN)) })
            assertEquals(null, assertDoesNotThrow<String?> { spool.track("x", mapOf("cart" to mapOf("total" to Double.POSITIVE_INFINITY))) })
            assertEquals(mapOf("invalid_property" to 2L), spool.handoffStats().refused)
        }
        // The first of a reason is logged, naming the key and the value.
        assertTrue(logged.any { "property score: NaN is not a JSON number" in it }, "$logged")
    }

    @Test
    fun `a Date, an Instant, an enum and nested collections arrive serialized, times in ISO 8601`() {
        val at = Instant.parse("2026-03-04T05:06:07.089Z")
        Spool(fastConfig(collector.url, db)).use { spool ->
            spool.track(
                "typed",
                mapOf(
                    "date" to Date.from(at), "instant" to at, "plan" to Plan.PRO,
                    "nested" to listOf(setOf(1, 2), arrayOf("a"), intArrayOf(3), mapOf("d" to Duration.ofSeconds(90))),
                ),
            )
            spool.flushBlocking()
            assertTrue(spool.waitDrainedBlocking(20_000))
        }
        assertEquals(
            listOf("""{"date":"2026-03-04T05:06:07.089Z","instant":"2026-03-04T05:06:07.089Z","nested":[[1,2],["a"],[3],{"d":"PT1M30S"}],"plan":"PRO"}"""),
            collector.storedProperties("typed").map { normalized(it) },
        )
    }

    /** The collector's stored JSON with its keys sorted, for a comparison that ignores key order. */
    private fun normalized(json: String): String =
        kotlinx.serialization.json.Json.parseToJsonElement(json).let { sortKeys(it) }.toString()

    private fun sortKeys(e: kotlinx.serialization.json.JsonElement): kotlinx.serialization.json.JsonElement = when (e) {
        is kotlinx.serialization.json.JsonObject -> kotlinx.serialization.json.JsonObject(e.toSortedMap().mapValues { sortKeys(it.value) })
        is kotlinx.serialization.json.JsonArray -> kotlinx.serialization.json.JsonArray(e.map { sortKeys(it) })
        else -> e
    }

    @Test
    fun `consent denied - each refused batch is counted in one step under its real reason`() {
        Spool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            spool.core.setConsent(Consent.DENIED) // behind the layer's back: the core refuses
            repeat(1_000) { spool.track("denied", mapOf("i" to it)) }
            spool.statsBlocking()
            val h = spool.handoffStats()
            assertEquals(mapOf("consent_denied" to 1_000L), h.rejected, "$h")
            assertEquals(h.batches, h.batches.coerceAtMost(10), "one call per batch, not one per event: $h")

            // Through the layer, later calls are refused at once, never handed off.
            runBlocking { spool.setConsent(Consent.DENIED) }
            repeat(10) { assertEquals(null, spool.track("denied", mapOf("i" to it))) }
            assertEquals(mapOf("consent_denied" to 10L), spool.handoffStats().refused)
        }
    }

    @Test
    fun `track at an app's pace does not wake the hand-off thread for each call`() {
        Spool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            spool.statsBlocking() // the spool is open, the hand-off thread idle
            val before = spool.handoffStats()
            // 300 calls 1 ms apart: an app tracking fast, but far from a burst.
            val calls = 300
            var next = System.nanoTime()
            repeat(calls) {
                next += 1_000_000
                while (System.nanoTime() < next) Thread.onSpinWait()
                spool.track("paced", mapOf("i" to it))
            }
            val tracked = spool.statsBlocking().tracked
            val after = spool.handoffStats()
            val batches = after.batches - before.batches
            val wakes = after.wakes - before.wakes
            // Each wake of a sleeping thread is a system call on the caller, and each batch one FFI
            // call and (durability = always) one commit: both must be a small share of the calls.
            println("paced: $batches batches, $wakes wakes for $calls calls")
            assertTrue(batches * 3 <= calls, "$batches batches for $calls paced calls: the hand-off thread was woken for each ($after)")
            assertTrue(wakes * 10 <= calls, "$wakes wakes for $calls paced calls ($after)")
            assertEquals(calls.toULong(), tracked)
        }
    }

    @Test
    fun `an idle hand-off thread sleeps until there is work - no timer wakes it`() {
        val before = Thread.getAllStackTraces().keys
        Spool(fastConfig(collector.url, db), startOffline = true).use { spool ->
            spool.track("one", mapOf())
            spool.statsBlocking()
            val thread = Thread.getAllStackTraces().keys.first { it.name == "eventspool-handoff" && it !in before }
            Thread.sleep(200) // well past the linger after the last batch: nothing left to do
            val states = (1..20).map { Thread.sleep(5); thread.state }
            assertTrue(states.all { it == Thread.State.WAITING }, "the idle hand-off thread was $states: a timer wakes it")
        }
    }

    @Test
    fun `a full hand-off - track returns at once and counts what it could not take`() {
        val stall = CountDownLatch(1)
        // The hand-off thread is held inside the report of a refused event: the queue fills.
        Spool(fastConfig(collector.url, db), startOffline = true, handoffCapacity = 8, onRejected = { stall.await(30, TimeUnit.SECONDS) }).use { spool ->
            spool.track("big", mapOf("blob" to "x".repeat(40_000)))
            assertTrue(waitUntil { spool.handoffStats().queued == 0L }, "the hand-off thread took the refused event")
            val ids = try {
                assertTimeoutPreemptively(
                    Duration.ofSeconds(5),
                    ThrowingSupplier { (0 until 100).map { spool.track("burst", mapOf("i" to it)) } },
                    { "track() waited for room in a full hand-off" },
                )
            } finally {
                stall.countDown()
            }
            val taken = ids.count { it != null }.toLong()
            assertEquals(7L, taken, "the hand-off holds 8, one of them the refused event in progress")
            assertEquals(mapOf("handoff_full" to 100L - taken), spool.handoffStats().refused)
            assertEquals(taken.toULong(), spool.statsBlocking().tracked)
        }
    }
}
