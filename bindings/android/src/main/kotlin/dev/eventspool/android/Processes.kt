package dev.eventspool.android

import android.app.ActivityManager
import android.app.Application
import android.os.Build
import android.os.Process
import java.io.File
import uniffi.eventspool.SpoolConfig

/**
 * Which process of the app this is. Only the main process tracks by default: every process of
 * an app runs `Application.onCreate`, and a second one (`android:process=":sync"`, LeakCanary's
 * `:leakcanary`) on the same store would be refused by its lock.
 */
internal object Processes {
    /** [name] is the process's name; [suffix] what follows the main process's name (`:sync`), empty for the main one. */
    data class Info(val name: String, val suffix: String) {
        val isMain: Boolean get() = suffix.isEmpty()
    }

    fun current(app: Application): Info {
        val main = app.applicationInfo?.processName ?: app.packageName
        val name = runCatching { nameOf(app) }.getOrNull() ?: main
        return Info(name, if (name == main) "" else name.removePrefix(main))
    }

    /** The config this process opens: the app's in the main process, a listed process's own store, or null (no tracking). */
    fun storeFor(process: Info, config: SpoolConfig, options: AndroidOptions): SpoolConfig? {
        if (process.isMain) return config
        val file = options.processStores[process.suffix] ?: options.processStores[process.name] ?: return null
        val db = config.dbPath ?: return config
        return config.copy(dbPath = File(File(db).parentFile, file).path)
    }

    private fun nameOf(app: Application): String? {
        if (Build.VERSION.SDK_INT >= Build.VERSION_CODES.P) return Application.getProcessName()
        val pid = Process.myPid()
        app.getSystemService(ActivityManager::class.java)?.runningAppProcesses?.firstOrNull { it.pid == pid }?.let { return it.processName }
        // The kernel's view; anything that is not one of this app's process names says nothing.
        return runCatching { File("/proc/self/cmdline").readText().substringBefore('\u0000').trim() }.getOrNull()
            ?.takeIf { it.startsWith(app.packageName) }
    }
}
