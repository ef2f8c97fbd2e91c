package eventspool

import dev.eventspool.Spool
import java.nio.file.Path
import java.util.concurrent.locks.LockSupport

/**
 * The process [KillTest] kills: tracks [rate] events a second into the store at args[0] with the
 * Kotlin layer's defaults (offline, nothing is sent) and prints each event's number once its
 * `track()` returned. It never stops by itself before 60 s: the test ends it with SIGKILL.
 */
object KillChild {
    @JvmStatic
    fun main(args: Array<String>) {
        val db = Path.of(args[0])
        val rate = args.getOrElse(1) { "1000" }.toLong()
        val config = fastConfig("http://127.0.0.1:9/v1/batch", db).copy(allowInsecureHttp = true)
        val spool = Spool(config, startOffline = true)
        val out = System.out
        val start = System.nanoTime()
        val periodNs = 1_000_000_000L / rate
        for (i in 0 until rate * 60) {
            val due = start + i * periodNs
            while (true) {
                val left = due - System.nanoTime()
                if (left <= 0) break
                LockSupport.parkNanos(left)
            }
            spool.track("kill", mapOf("i" to i))
            out.println(i)
            out.flush()
        }
        spool.close()
    }
}
