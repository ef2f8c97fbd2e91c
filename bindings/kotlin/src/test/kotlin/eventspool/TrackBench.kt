package eventspool

import dev.eventspool.Spool
import java.nio.file.Files
import java.util.UUID
import org.junit.jupiter.api.Tag
import org.junit.jupiter.api.Test
import uniffi.eventspool.EventSpool

/**
 * The cost of `track()` on the calling thread, 200,000 calls each, one run (BENCHMARKS.md):
 * the generated binding, the Kotlin layer (accepting; consent denied; hand-off full), and a
 * pure-Kotlin baseline (UUID + ArrayDeque push of the same JSON). Targets (issue: the host app
 * never blocks): the layer's p99.9 at most 20 us and its max at most 1 ms in all three. Not part of the suite (tag `bench`); run it with
 * `mvn -q test -Deventspool.excludedGroups=none -Dgroups=bench -Dtest=TrackBench`.
 *
 * `-Deventspool.bench.callerPriority=fifo` runs the calling thread as SCHED_FIFO, as Android
 * runs the top app's UI thread where `sys.use_fifo_ui` is on: the figures are then the call's
 * own, not the time the kernel gave this core to the hand-off thread, the JIT or the collector
 * (on a 2-core machine a normal-priority caller waits behind them for milliseconds).
 */
@Tag("bench")
class TrackBench {
    private val n = 200_000
    private val warm = 20_000
    // 250 bytes once the core adds id, timestamp and name.
    private val props: Map<String, Any?> = mapOf(
        "screen" to "checkout/payment", "button" to "confirm", "cart_items" to 3, "total" to 59.9,
        "currency" to "EUR", "ab" to "variant-b", "first" to false,
    )
    private val json = """{"screen":"checkout/payment","button":"confirm","cart_items":3,"total":59.9,"currency":"EUR","ab":"variant-b","first":false}"""

    private fun figures(label: String, samples: LongArray, extra: String = "") {
        samples.sort()
        val median = samples[samples.size / 2] / 1000.0
        val p99 = samples[(samples.size * 99) / 100] / 1000.0
        val p999 = samples[(samples.size * 999) / 1000] / 1000.0
        val mean = samples.average() / 1000.0
        println("BENCH %-34s median %7.2f us  mean %7.2f us  p99 %8.2f us  p99.9 %8.2f us  max %9.1f us  %s".format(label, median, mean, p99, p999, samples.last() / 1000.0, extra))
    }

    private inline fun timed(count: Int, call: (Int) -> Unit): LongArray {
        val out = LongArray(count)
        for (i in 0 until count) {
            val t0 = System.nanoTime()
            call(i)
            out[i] = System.nanoTime() - t0
        }
        return out
    }

    /** The libc call that gives the calling thread a real-time policy (Linux; needs CAP_SYS_NICE). */
    private interface LibC : com.sun.jna.Library {
        fun sched_setscheduler(pid: Int, policy: Int, param: IntArray): Int
    }

    private fun callerPriority() {
        if (System.getProperty("eventspool.bench.callerPriority") != "fifo") return
        val libc = com.sun.jna.Native.load("c", LibC::class.java)
        // pid 0: the calling thread; SCHED_FIFO = 1; the lowest real-time priority.
        val rc = libc.sched_setscheduler(0, 1, intArrayOf(1))
        println("BENCH caller priority: " + if (rc == 0) "SCHED_FIFO 1" else "SCHED_FIFO refused (errno ${com.sun.jna.Native.getLastError()}), normal priority")
    }

    @Test
    fun `track on the calling thread`() {
        callerPriority()
        val dir = Files.createTempDirectory("eventspool-bench")
        // Offline to a closed port: only the recording is measured, never a request.
        fun config(name: String) = fastConfig("http://127.0.0.1:9/v1/batch", dir.resolve(name))
            .copy(allowInsecureHttp = true, memoryCapacity = 10_000uL)

        val baseline = ArrayDeque<Pair<String, String>>()
        timed(warm) { baseline.addLast(UUID.randomUUID().toString() to json) }
        baseline.clear()
        figures("pure Kotlin (UUID + ArrayDeque)", timed(n) { baseline.addLast(UUID.randomUUID().toString() to json) })

        EventSpool(config("generated.db"), startOffline = true).use { spool ->
            timed(warm) { spool.track("checkout", json) }
            figures("generated EventSpool.track", timed(n) { spool.track("checkout", json) })
        }

        // The accept path at a rate the hand-off thread keeps up with (one call every 200 us,
        // 5,000 a second; the spin between calls is not timed), default hand-off: nothing refused.
        Spool(config("paced.db"), startOffline = true).use { spool ->
            timed(warm) { spool.track("checkout", props) }
            spool.statsBlocking()
            val samples = LongArray(n)
            var next = System.nanoTime()
            for (i in 0 until n) {
                next += 200_000
                while (System.nanoTime() < next) Thread.onSpinWait()
                val t0 = System.nanoTime()
                spool.track("checkout", props)
                samples[i] = System.nanoTime() - t0
            }
            spool.statsBlocking()
            val h = spool.handoffStats()
            figures("layer Spool.track, 5,000/s", samples, "%d batches, %d wakes, refused %s".format(h.batches, h.wakes, h.refused))
        }

        // A burst: the 200,000 calls back to back into a hand-off big enough for all of them, so
        // none is refused; the backlog it holds is what the collector has to copy (the max).
        Spool(config("layer.db"), startOffline = true, handoffCapacity = 262_144).use { spool ->
            timed(warm) { spool.track("checkout", props) }
            spool.waitDrainedBlocking(1) // hand-off empty before the measured run
            val start = System.nanoTime()
            val samples = timed(n) { spool.track("checkout", props) }
            val callsMs = (System.nanoTime() - start) / 1e6
            spool.statsBlocking()
            val allMs = (System.nanoTime() - start) / 1e6
            val h = spool.handoffStats()
            figures(
                "layer Spool.track, burst", samples,
                "calls %.0f ms, committed by the hand-off thread after %.0f ms (%.0f k events/s, durability=always), %d batches, refused %s".format(
                    callsMs, allMs, n / allMs, h.batches, h.refused,
                ),
            )
        }

        // Consent denied: refused at the call, counted, nothing handed off.
        Spool(config("denied.db"), startOffline = true).use { spool ->
            kotlinx.coroutines.runBlocking { spool.setConsent(uniffi.eventspool.Consent.DENIED) }
            timed(warm) { spool.track("checkout", props) }
            val samples = timed(n) { spool.track("checkout", props) }
            figures("layer Spool.track, consent denied", samples, "refused %s".format(spool.handoffStats().refused))
        }

        // The hand-off full: its thread is held (inside the report of a refused event), so every
        // measured call finds no room and is counted as handoff_full.
        val stall = java.util.concurrent.CountDownLatch(1)
        Spool(config("full.db"), startOffline = true, handoffCapacity = 64, onRejected = { stall.await() }).use { spool ->
            spool.track("big", mapOf("blob" to "x".repeat(40_000)))
            waitUntil { spool.handoffStats().queued == 0L }
            timed(warm) { spool.track("checkout", props) }
            val samples = timed(n) { spool.track("checkout", props) }
            figures("layer Spool.track, hand-off full", samples, "refused %s".format(spool.handoffStats().refused))
            stall.countDown()
        }
    }
}
