# bash completion for car and car-inferenced (installed as both names). The words come from the programs'
# own --help at completion time - CLI11's "Subcommands:" and option lists for car, the flag list for
# car-inferenced - so the completion follows the commands the installed binary actually has.

_car_help_words() {
  # $1: the section to read ("Subcommands" or "Options"); the rest: the command line to ask for --help.
  local section=$1
  shift
  "$@" --help 2>/dev/null | awk -v sec="$section" '
    /^[A-Za-z]+:$/ { insec = ($0 == sec ":"); next }
    insec && /^  [^ ]/ {
      if (sec == "Subcommands") { print $1; next }
      n = split($1, names, ",")
      for (i = 1; i <= n; i++) if (names[i] ~ /^-/) print names[i]
    }'
}

_car() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case "$prev" in
    --socket|-o|--output|--config) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  # The subcommand path typed so far (words before the cursor that are not options or files).
  local -a cmd=("${COMP_WORDS[0]}")
  local i
  for ((i = 1; i < COMP_CWORD; i++)); do
    local w=${COMP_WORDS[i]}
    [[ $w == -* ]] && continue
    if _car_help_words Subcommands "${cmd[@]}" | grep -qxF -- "$w"; then cmd+=("$w"); fi
  done
  local words
  if [[ $cur == -* ]]; then
    words=$(_car_help_words Options "${cmd[@]}")
  else
    words=$(_car_help_words Subcommands "${cmd[@]}")
    if [ -z "$words" ]; then
      # A leaf command: model files and the like.
      compopt -o filenames 2>/dev/null
      COMPREPLY=($(compgen -f -- "$cur"))
      return
    fi
  fi
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}

_car_inferenced() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  if [[ $prev == --config || $prev == --socket || $prev == --models-dir || $prev == --state-dir ]]; then
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -- "$cur"))
    return
  fi
  # car-inferenced --help lists "  --flag VALUE  (VARIABLE)" lines.
  local words
  words=$("${COMP_WORDS[0]}" --help 2>/dev/null | awk '/^  --[a-z]/ { print $1 }')
  COMPREPLY=($(compgen -W "$words --version --help" -- "$cur"))
}

complete -F _car car
complete -F _car_inferenced car-inferenced
