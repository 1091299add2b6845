/*
 * The pod sandbox's process for the local cluster's real node (tests/cluster/node-images.sh packs it
 * into teifleet.local/pause): it holds the pod's namespaces, reaps the zombies of a shared PID
 * namespace, and exits at SIGTERM or SIGINT, as Kubernetes' own pause (build/pause/linux/pause.c).
 * Built static, so the image is this one file.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal) {
  (void)signal;
  _exit(0);
}

static void reap(int signal) {
  (void)signal;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("teifleet pause 1");
    return 0;
  }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not PID 1\n");
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = stop;
  if (sigaction(SIGINT, &action, NULL) < 0 || sigaction(SIGTERM, &action, NULL) < 0) return 1;
  action.sa_handler = reap;
  action.sa_flags = SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &action, NULL) < 0) return 2;
  for (;;) pause();
}
