# Which Python each stack runs on: sourced by setup_env.sh. Prints the interpreter for stack $1 ($PYTHON
# when it is that version), or nothing when this machine has none (pyenv's versions are searched too:
# CI has 3.12 there, not on PATH).
stack_python_version() {
  case "$1" in
    oldest) echo 3.11 ;;
    current) echo 3.12 ;;
    current-py313) echo 3.13 ;;
  esac
}

stack_python() {
  local want
  want="$(stack_python_version "$1")"
  local root candidate
  root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  for candidate in ${PYTHON:-} "python$want" "$root"/versions/"$want".*/bin/python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys, venv' 2>/dev/null \
       && [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]; then
      command -v "$candidate"; return
    fi
  done
}
